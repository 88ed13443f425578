"""Typing while a chat answer streams: held off the screen on a terminal (a pseudo-terminal
here), the terminal restored afterwards, on Ctrl-C too; pipes untouched."""

from __future__ import annotations

import io
import os
import select

import pytest

from specgen.cli.terminal import tty_fd, typing_held

termios = pytest.importorskip("termios")
pty = pytest.importorskip("pty")


@pytest.fixture
def terminal():
    """The user's side (what they type into) and the program's side (a TTY stdin)."""
    user, program = pty.openpty()
    stdin = os.fdopen(program, "r", closefd=False)
    yield user, program, stdin
    stdin.close()
    os.close(user)
    os.close(program)


def _lflag(fd: int) -> int:
    return termios.tcgetattr(fd)[3]


def _pending(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0.2)[0])


def test_echo_and_line_editing_are_off_while_an_answer_streams(terminal):
    user, program, stdin = terminal
    before = termios.tcgetattr(program)
    assert _lflag(program) & termios.ECHO
    with typing_held(stdin):
        flags = _lflag(program)
        assert not flags & termios.ECHO and not flags & termios.ICANON
        assert flags & termios.ISIG  # Ctrl-C still stops the answer
        os.write(user, b"typed ahead\n")
        assert not _pending(user)  # nothing echoed back onto the screen
    assert termios.tcgetattr(program) == before
    assert not _pending(program)  # what was typed meanwhile was dropped, never sent


def test_the_terminal_is_restored_after_ctrl_c(terminal):
    _, program, stdin = terminal
    before = termios.tcgetattr(program)
    with pytest.raises(KeyboardInterrupt), typing_held(stdin):
        raise KeyboardInterrupt
    assert termios.tcgetattr(program) == before


def test_pipes_and_test_doubles_are_left_alone(tmp_path):
    read, write = os.pipe()
    try:
        with os.fdopen(read, "r", closefd=False) as pipe:
            assert tty_fd(pipe) is None
            with typing_held(pipe):
                pass
    finally:
        os.close(read)
        os.close(write)
    assert tty_fd(io.StringIO()) is None
    with typing_held(io.StringIO()):
        pass
