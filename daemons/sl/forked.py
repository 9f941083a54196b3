"""An ML program started by the host's fork server (``swarmlearning/forkserver.py``) instead of exec.

The SL hands the server the command line, working directory and environment, with the write end of a
pipe for the program's output; the server forks a child that becomes the program, answers with its pid
and, when it has ended, with its exit status. To the SL the result looks like the
``asyncio.subprocess.Process`` it would have started: ``pid``, ``stdout``, ``returncode``, ``wait()``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from pathlib import Path

from wire.errors import CodecError
from wire.forks import ForkReply, ForkRequest, ServerSpec, decode_reply, refusal
from wire.frames import HEADER_PREFIX, header_length

__all__ = ["ANSWER_TIMEOUT_S", "ForkRefusedError", "ForkedProgram", "start_forked"]

log = logging.getLogger("swarm.sl.ml")

ANSWER_TIMEOUT_S = 120.0  # the server answers once it has imported torch: seconds, even on a slow host


class ForkRefusedError(Exception):
    """The fork server will not start this program (the reason is the message); start it another way."""


class ForkedProgram:
    """A running program the fork server started."""

    def __init__(
        self,
        pid: int,
        stdout: asyncio.StreamReader,
        replies: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.pid = pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._replies, self._writer = replies, writer
        self._ended: asyncio.Future[int] | None = None

    async def wait(self) -> int:
        """The program's exit status, once the server reports it (``-N``: signal N ended it).

        The reply is read in a task of its own that a cancelled wait leaves running, so that no reply is
        cut in half (``stop_process_group`` waits with a timeout)."""
        if self._ended is None:
            self._ended = asyncio.ensure_future(self._exit_status())
        self.returncode = await asyncio.shield(self._ended)
        return self.returncode

    async def _exit_status(self) -> int:
        try:
            return await self._read_exit_status()
        finally:
            self._writer.close()

    async def _read_exit_status(self) -> int:
        try:
            reply = await _read_reply(self._replies)
        except (asyncio.IncompleteReadError, ConnectionError, CodecError) as exc:
            reply = ForkReply()
            why = f"{type(exc).__name__}: {exc}"
        else:
            why = f"it sent {reply}"
        if reply.exit is not None:
            return reply.exit
        log.warning(
            "the fork server gave no exit status for pid %d (%s); counting it as failed", self.pid, why
        )
        await _gone(self.pid)
        return 1


async def _gone(pid: int) -> None:
    """Until process ``pid`` (not our child) has ended."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop, ended = asyncio.get_running_loop(), asyncio.Event()
    loop.add_reader(fd, ended.set)
    try:
        await ended.wait()
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def _read_reply(reader: asyncio.StreamReader) -> ForkReply:
    length = header_length(await reader.readexactly(HEADER_PREFIX.size))
    return decode_reply(await reader.readexactly(length))


async def start_forked(
    path: str, argv: list[str], cwd: Path, env: dict[str, str], *, limit: int
) -> ForkedProgram:
    """Ask the fork server at ``path`` to start ``argv``.

    What the server would refuse, by its spec, is refused here at once: the server answers only once it
    has imported torch.

    Raises:
        ForkRefusedError: it will not (another interpreter, an environment that differs, ...).
        OSError: there is no server at ``path``.
        RuntimeError: the server took the request but gave no pid.
    """
    request = ForkRequest(tuple(argv), str(cwd), env)
    try:
        spec = ServerSpec.read(ServerSpec.path_for(path))
    except CodecError as exc:
        raise OSError(str(exc)) from None
    why = refusal(request, spec)
    if why is not None:
        raise ForkRefusedError(why)
    loop = asyncio.get_running_loop()
    read_fd, write_fd = os.pipe()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        await loop.sock_connect(sock, path)
        data = request.encode()
        sent = socket.send_fds(sock, [data], [write_fd])
        await loop.sock_sendall(sock, data[sent:])
    except BaseException:
        sock.close()
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)  # the child holds its own copy now; ours would keep the pipe from ending
    replies, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 16)
    try:
        async with asyncio.timeout(ANSWER_TIMEOUT_S):
            reply = await _read_reply(replies)
    except (TimeoutError, asyncio.IncompleteReadError, ConnectionError, CodecError) as exc:
        writer.close()
        os.close(read_fd)
        raise RuntimeError(
            f"the fork server at {path} gave no answer ({type(exc).__name__}: {exc})"
        ) from None
    if reply.pid is None:
        writer.close()
        os.close(read_fd)
        raise ForkRefusedError(reply.refused or f"unexpected reply {reply}")
    stdout = asyncio.StreamReader(limit=limit)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdout), os.fdopen(read_fd, "rb", 0))
    return ForkedProgram(reply.pid, stdout, replies, writer)
