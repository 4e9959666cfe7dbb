"""gdb's captured command output under the console and under MI (gdb 18 returns MI records to
``gdb.execute(..., to_string=True)`` when it runs the MI interpreter): the same text either way."""

from __future__ import annotations

from heapwalk.inferior.mitext import c_string, console_text

CONSOLE = ("Symbols from \"/x/prog\".\nLocal core dump file:\n\t`/tmp/core', file type elf64-x86-64.\n"
           "\t0x0000555555554000 - 0x0000555555555000 is load1\n")


def _as_mi(text: str) -> str:
    """TEXT as gdb/MI writes console output: one ~"..." record per line, with C escapes."""
    out = []
    for line in text.splitlines(keepends=True):
        body = line.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
        out.append(f'~"{body}"')
    return "\n".join(out) + "\n"


def test_console_text_is_left_as_it_is():
    assert console_text(CONSOLE) == CONSOLE
    assert console_text("") == ""


def test_mi_stream_records_give_the_console_text():
    assert console_text(_as_mi(CONSOLE)) == CONSOLE
    # log and target streams, and result records, are not the command's output
    mixed = '&"info target\\n"\n' + _as_mi(CONSOLE) + '^done\n(gdb) \n'
    assert console_text(mixed) == CONSOLE


def test_octal_escapes_are_utf8_bytes():
    assert c_string(r"caf\303\251 \"q\" \\ \t.") == 'café "q" \\ \t.'


def test_text_that_only_looks_like_a_record_stays_text():
    text = '~"not mi"\nbut this line is plain text\n'
    assert console_text(text) == text
