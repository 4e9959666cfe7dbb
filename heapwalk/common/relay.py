"""The lines heapwalk in gdb sends the command line that drives it, on gdb's error stream, when the command
line's user is at a terminal: what a command is expected to cost, said before it starts, and the progress of
long work, which the command line shows as they come (its standard output gets the command's output whole,
at its end)."""

__all__ = ["RELAY", "SAY", "PROGRESS"]

#: set to "1" in the environment of the gdb the command line drives when its user is at a terminal
RELAY = "HEAPWALK_RELAY"
#: "heapwalk-say|LINE": a line to show at once
SAY = "heapwalk-say"
#: "heapwalk-progress|LABEL|DONE|TOTAL" (bytes), and "heapwalk-progress|LABEL|end|0" when the work ends
PROGRESS = "heapwalk-progress"
