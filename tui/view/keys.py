"""Every key of the app, once: the bindings, the footer, the help screen (? / F1) and the
command palette (ctrl+p) are all built from :data:`KEYS`, so none of them can forget one."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding, BindingType


@dataclass(frozen=True)
class Key:
    keys: str  # Textual key names, comma separated
    action: str
    label: str  # the footer's word
    help: str  # the help screen's and command palette's sentence
    group: str  # "view" | "live settings" | "replay" | "app"
    show: bool = True  # in the footer
    display: str = ""  # how the footer / help write the key ("1-4"); default: the key itself
    #: Before the focused widget's own binding (the grid scrolls on ←/→ otherwise, and the
    #: footer then hides the replay's seek keys).
    priority: bool = False


KEYS: tuple[Key, ...] = (
    Key("q", "quit", "quit", "Quit commtop (ctrl+c and ctrl+q too); the job it started ends with it", "app"),
    Key("question_mark,f1", "help", "help", "This list of keys", "app", display="?/F1"),
    Key("v", "toggle_view", "rows/heat", "Switch between one row per rank and the latency heat map", "view"),
    Key(
        "f",
        "next_stream",
        "stream",
        "Latency lines and the ranks' last/p50/p99 of each stream (group, op, size) in turn, then of all",
        "view",
    ),
    Key("i", "toggle_connect", "connect", "Show or hide how to connect workers to this run (watch)", "view"),
    Key(
        "l", "job_log", "log", "The job's output: every rank's last lines, the first failing rank's error first", "view"
    ),
    Key("o", "cycle_mode", "mode", "Next offload mode: none → overlap → sync → sync-barrier", "live settings"),
    Key(
        "1",
        "pick_mode(0)",
        "modes",
        "Offload mode none (1), overlap (2), sync (3), sync-barrier (4)",
        "live settings",
        display="1-4",
    ),
    Key("2", "pick_mode(1)", "overlap", "Offload mode overlap", "live settings", show=False),
    Key("3", "pick_mode(2)", "sync", "Offload mode sync", "live settings", show=False),
    Key("4", "pick_mode(3)", "sync-barrier", "Offload mode sync-barrier", "live settings", show=False),
    Key("c", "copies(-1)", "copies", "One copy per step fewer (c) or more (C)", "live settings", display="c/C"),
    Key("C,shift+c", "copies(1)", "copies+", "One copy per step more", "live settings", show=False),
    Key("s", "cycle_scale", "size", "Next copy size (× the collective's tensor): 0.25, 0.5, 1, 2", "live settings"),
    Key("h", "toggle_pinned", "pinned", "Copies to/from pinned or pageable host memory", "live settings"),
    Key("d", "toggle_direction", "dir", "Copy direction: device→host (d2h) or host→device (h2d)", "live settings"),
    Key("r", "toggle_record", "rec", "Start or stop recording to a .commtop file", "app"),
    Key(
        "a",
        "ab",
        "A/B",
        "A/B experiment: current settings vs none in random AB/BA blocks, B/A with a 95 % interval; a again stops it",
        "live settings",
    ),
    Key("space", "replay_pause", "pause", "Pause or resume the replay", "replay"),
    Key(
        "plus,equals_sign", "replay_speed(1)", "faster", "Replay faster (×2 a press, up to ×64)", "replay", display="+"
    ),
    Key("minus", "replay_speed(-1)", "slower", "Replay slower (÷2 a press, down to ×0.25)", "replay", display="-"),
    Key("left", "replay_seek(-5)", "-5s", "Back 5 seconds", "replay", display="←", priority=True),
    Key("right", "replay_seek(5)", "+5s", "Forward 5 seconds", "replay", display="→", priority=True),
    Key("n", "replay_jump(1)", "next change", "Jump to the next settings change (◆ on the bar)", "replay"),
    Key("p", "replay_jump(-1)", "prev change", "Jump to the previous settings change", "replay"),
)


def bindings() -> list[BindingType]:
    out: list[BindingType] = [
        Binding(k.keys, k.action, k.label, show=k.show, key_display=k.display or None, priority=k.priority)
        for k in KEYS
    ]
    # top, nvitop and torchrun users press ctrl+c to leave (Textual's default only says how to);
    # it quits as q does, and commtop then exits 130, as a command a shell's Ctrl-C stopped.
    out.append(Binding("ctrl+c", "interrupt", "quit", show=False, priority=True))
    return out
