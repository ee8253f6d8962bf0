"""What a run can be asked to change: the one decision behind `commtop ctl`, the TUI's setting
keys, `commtop ab` and the A/B key, so none of them accepts what the job would ignore.

A run is one of three kinds, as its Hellos say:

* commtop's own loop: every field of :class:`~workers.wire.settings.Settings` (mode, copies,
  copy size, pinned, direction, the straggler delay), ``delay_rank`` within the world;
* a monitored job (``workers.monitor``): only the knobs it declared with ``mon.knob(name,
  choices)``, each one of its choices, and ``mode`` when one knob is its offload-mode knob;
* a job with no knobs (an unmodified script under the capture bootstrap, or a monitored one
  that declared none): nothing.

Live control may also be off (``COMMTOP_LIVE_CONTROL=0``, or a job whose ranks could not reach
torchrun's store): then nothing changes either, and every request says so at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workers.wire.protocol import MODES
from workers.wire.settings import MAX_KNOB_TEXT, MAX_KNOBS, Settings, SettingsError, knob_name

LOOP = "loop"
KNOBS = "knobs"
NOTHING = "nothing"
UNKNOWN = "unknown"
KINDS = (LOOP, KNOBS, NOTHING, UNKNOWN)

#: The settings of commtop's own loop, in the order `ctl` and the keys name them.
LOOP_SETTINGS = ("mode", "copies", "copy_scale", "pinned", "direction", "delay_ms", "delay_rank", "delay_on")
#: How a refusal names a loop setting a job does not have.
_WORDS = {"copy_scale": "copy scale", "delay_ms": "a straggler delay", "delay_rank": "a straggler delay"}
_WORDS["delay_on"] = "a straggler delay"

LIVE_OFF = (
    "live control is off in this run (COMMTOP_LIVE_CONTROL=0, or no store to agree through): "
    "its settings stay as they started"
)


def knob_choices(config: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """The knobs a monitored job declared (Hello.config["knobs"]: name -> choices), bounded."""
    knobs = config.get("knobs")
    if not isinstance(knobs, Mapping):
        return {}
    out: dict[str, tuple[str, ...]] = {}
    for name, choices in list(knobs.items())[:MAX_KNOBS]:
        if isinstance(name, str) and isinstance(choices, (list, tuple)) and all(isinstance(c, str) for c in choices):
            out[name[:MAX_KNOB_TEXT]] = tuple(c[:MAX_KNOB_TEXT] for c in choices[:64])
    return out


@dataclass(frozen=True)
class Changeable:
    """What one run can change (see the module docstring); ``check`` is the decision."""

    kind: str = UNKNOWN
    #: a monitored job's knobs and their choices, in declaration order
    knobs: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: the knob whose value is the records' offload mode ("" without one)
    mode_knob: str = ""
    #: ranks in the run (0: not known), for ``delay_rank``
    world_size: int = 0
    live: bool = True
    #: a monitored job's script ("train_ddp.py"), for the words of a refusal
    job: str = ""
    #: a monitored job's knobs are final (it finished a step: knobs are declared before the loop)
    settled: bool = True

    # ------------------------------------------------------------------ built from

    @classmethod
    def from_hello(cls, config: Mapping[str, Any], world_size: int) -> Changeable:
        """From a Hello's ``config`` (the loop's LoopConfig, or a monitored job's description)."""
        live = config.get("live_control", True) is not False
        if config.get("source") != "monitor":
            return cls(LOOP, world_size=world_size, live=live)
        knobs = knob_choices(config)
        mode_knob = config.get("mode_knob")
        return cls(
            KNOBS if knobs else NOTHING,
            knobs=knobs,
            mode_knob=mode_knob if isinstance(mode_knob, str) and mode_knob in knobs else "",
            world_size=world_size,
            live=live,
            job=str(config.get("collective", "")).removeprefix("monitor: ")[:MAX_KNOB_TEXT],
            settled=config.get("knobs_final", True) is not False,
        )

    @classmethod
    def loop(cls, world_size: int = 0) -> Changeable:
        """commtop's own loop (what `commtop ab` without a script starts)."""
        return cls(LOOP, world_size=world_size)

    def wire(self) -> dict[str, Any]:
        """As `ctl status` sends it."""
        return {
            "kind": self.kind,
            "knobs": {k: list(v) for k, v in self.knobs.items()},
            "mode_knob": self.mode_knob,
            "world_size": self.world_size,
            "live": self.live,
            "job": self.job,
            "settled": self.settled,
        }

    @classmethod
    def from_wire(cls, data: object) -> Changeable:
        """From a `ctl status` reply (UNKNOWN when absent or malformed: an older collector)."""
        if not isinstance(data, Mapping) or data.get("kind") not in KINDS:
            return cls()
        knobs = knob_choices(data)
        mode_knob = data.get("mode_knob")
        world = data.get("world_size")
        return cls(
            str(data["kind"]),
            knobs=knobs,
            mode_knob=mode_knob if isinstance(mode_knob, str) and mode_knob in knobs else "",
            world_size=world if isinstance(world, int) and not isinstance(world, bool) and world > 0 else 0,
            live=data.get("live", True) is not False,
            job=str(data.get("job", ""))[:MAX_KNOB_TEXT],
            settled=data.get("settled", True) is not False,
        )

    # ------------------------------------------------------------------ what it has

    @property
    def known(self) -> bool:
        """Whether the decision is final (a monitored job may still declare knobs before its loop)."""
        return self.kind != UNKNOWN and (self.kind != NOTHING or self.settled)

    def names(self) -> tuple[str, ...]:
        """What `ctl set` may name in this run (``knob.X`` for a job's knobs)."""
        if not self.live or self.kind in (NOTHING, UNKNOWN):
            return ()
        if self.kind == LOOP:
            return LOOP_SETTINGS
        return (("mode",) if self.mode_knob else ()) + tuple(f"knob.{k}" for k in self.knobs)

    def modes(self) -> tuple[str, ...]:
        """The offload modes ``mode`` may take here (none for a job without a mode knob)."""
        if not self.live or self.kind in (NOTHING, UNKNOWN):
            return ()
        if self.kind == LOOP:
            return MODES
        return tuple(m for m in self.knobs.get(self.mode_knob, ()) if m in MODES)

    def describe(self) -> str:
        """The run's settings in a few words: "knobs offload (none/overlap/sync)"."""
        if not self.live:
            return "nothing (live control is off)"
        if self.kind == LOOP:
            return "settings " + ", ".join(LOOP_SETTINGS)
        if self.kind == KNOBS:
            return "knobs " + ", ".join(f"{k} ({'/'.join(v)})" for k, v in self.knobs.items())
        if self.kind == NOTHING:
            return "nothing (no knobs)" if self.settled else "nothing yet (no knobs declared)"
        return "not known yet (no worker has reported)"

    # ------------------------------------------------------------------ the decision

    def check(self, changes: Mapping[str, Any]) -> str:
        """ "" when the run honours every change, else the one-line reason (the first refused)."""
        if not changes:
            return "nothing to change"
        for name, value in changes.items():
            why = self.why_not(str(name), value)
            if why:
                return why
        return ""

    def why_not(self, name: str, value: Any = None) -> str:
        """ "" when ``name`` (with ``value``, unless None) can be set here, else the reason."""
        if not self.live:
            return LIVE_OFF
        if self.kind == UNKNOWN:
            return "the workers have not reported their settings yet; try again in a moment"
        if self.kind == LOOP:
            return self._loop_refusal(name, value)
        who = self.job or "this job"
        if self.kind == NOTHING:
            if not self.settled:
                return f"{who} has declared no knobs yet; try again in a moment"
            return (
                f"{who} has no live knobs (an unmodified script: commtop only watches it; "
                "declare one with workers.monitor's mon.knob)"
            )
        return self._knob_refusal(who, name, value)

    def _loop_refusal(self, name: str, value: Any) -> str:
        if knob_name(name) is not None:
            return f"{name}: commtop's own loop has no knobs (its {self.describe()})"
        if name not in LOOP_SETTINGS:
            return f"unknown setting {name!r} (this run's {self.describe()})"
        if value is None:
            return ""
        try:
            Settings().updated({name: value})
        except SettingsError as exc:
            return str(exc)
        if name == "delay_rank" and self.world_size > 0 and int(value) >= self.world_size:
            return (
                f"delay_rank={value}: this run has {self.world_size} ranks "
                f"(0..{self.world_size - 1}, or -1 for every rank)"
            )
        return ""

    def _knob_refusal(self, who: str, name: str, value: Any) -> str:
        knobs = self.describe().removeprefix("knobs ")
        if name == "mode":
            if not self.mode_knob:
                return f"{who} has no offload-mode knob (its knobs: {knobs})"
            choices = self.knobs[self.mode_knob]
            if value is not None and str(value) not in choices:
                return f"mode={value}: {who}'s {self.mode_knob} knob takes {', '.join(choices)}"
            return ""
        if name in LOOP_SETTINGS:
            return f"{who} has no knob for {_WORDS.get(name, name)} (its knobs: {knobs})"
        knob = knob_name(name, self.knobs)
        if knob is None or knob not in self.knobs:
            return f"{who} has no knob {knob or name!r} (its knobs: {knobs})"
        if value is not None and str(value) not in self.knobs[knob]:
            return f"{name}={value}: choices {', '.join(self.knobs[knob])}"
        return ""

    def updated(self, current: Settings, changes: Mapping[str, Any]) -> Settings:
        """``current`` with ``changes`` applied, checked (SettingsError with the reason). A
        job's mode knob and ``mode`` move together, so what is requested is what comes in force."""
        why = self.check(changes)
        if why:
            raise SettingsError(why)
        wanted = {str(k): v for k, v in changes.items()}
        if self.kind == KNOBS:
            wanted = self._with_mode_knob(wanted)
        return current.updated(wanted, self.knobs if self.kind == KNOBS else None)

    def _with_mode_knob(self, changes: dict[str, Any]) -> dict[str, Any]:
        mk = self.mode_knob
        if not mk:
            return changes
        named = [name for name in changes if knob_name(name, self.knobs) == mk]
        knob = changes[min(named, key=lambda n: not n.startswith("knob."))] if named else None  # knob.X wins
        if "mode" in changes and knob is None:
            changes[f"knob.{mk}"] = changes["mode"]
        elif knob is not None and "mode" not in changes and knob in MODES:
            changes["mode"] = knob
        return changes


def job_refusal(changes: Mapping[str, Any]) -> str:
    """Before a user's job has said which knobs it has: the loop's own settings (other than the
    mode a job's knob may take) are never a job's; "" when nothing is refused yet."""
    for name, value in changes.items():
        if name == "mode" and value not in MODES:
            return f"mode must be one of {', '.join(MODES)}; got {value!r}"
        if name in LOOP_SETTINGS and name != "mode":
            return (
                f"a job has no knob for {_WORDS.get(name, name)} (that is commtop's own loop; "
                "a job's knobs are knob.NAME, declared with mon.knob)"
            )
    return ""
