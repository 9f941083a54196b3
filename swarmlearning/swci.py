"""``from swarmlearning.swci import Swci``: the reference's Python client of SWCI's web mode.

The same constructor and method names as the reference's class; each method sends one SWCI command to
``POST /exec?cmd=...`` of a ``swci --web`` server (``run-swci -e SWCI_MODE=WEB``) and returns the lines
of its answer, or ``[]`` when the command failed (``getErrors()`` then says why). Only the standard
library is used (``urllib``, ``ssl``): with ``clientCert`` the connection is mutual TLS, and the server
is verified against ``clientCABundle`` (a PEM file or a directory of them) when one is given.
"""

from __future__ import annotations

import json
import logging
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_CONTRACT", "DEFAULT_TASKRUNNER", "Swci"]

DEFAULT_TASKRUNNER = "defaulttaskbb.taskdb.sml.hpe"
DEFAULT_CONTRACT = "defaultbb.cqdb.sml.hpe"
_DONE_STATES = ("COMPLETE", "ERROR", "IDLE")
_TIMEOUT = 7200.0  # WAIT FOR TASKRUNNER may run for the reference's two hours

# commands whose answers rarely change: cached while enableCaching is on (the reference's list)
_GET_CONTEXT_INFO = "get context info "
_GET_CONTRACT_INFO = "get contract info "
_GET_TASK_BODY = "get task body "
_GET_TASK_INFO = "get task info "
_GET_TASKRUNNER_INFO = "get taskrunner info "
_LIST_CONTEXTS = "list contexts"
_LIST_CONTRACTS = "list contracts"
_LIST_TASKS = "list tasks"
_LIST_TASKRUNNERS = "list taskrunners"


def _default_logger(level: int) -> logging.Logger:
    """The reference's ``swci-web`` logger: ``swci-web.log`` in the current directory and stderr."""
    logger = logging.getLogger("swci-web")
    if not logger.handlers:
        formatter = logging.Formatter("%(asctime)s [%(levelname)-5.5s]  %(message)s")
        for handler in (logging.FileHandler("swci-web.log"), logging.StreamHandler()):
            handler.setFormatter(formatter)
            logger.addHandler(handler)
    logger.setLevel(level)
    return logger


def _tls_context(cert: str, key: str | None, ca_bundle: str | None, logger: logging.Logger) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False  # the reference reaches swci by IP or container name
    context.load_cert_chain(cert, key)
    if ca_bundle is None:
        logger.warning("no clientCABundle: the swci server's certificate is not verified")
        context.verify_mode = ssl.CERT_NONE
        return context
    context.verify_mode = ssl.CERT_REQUIRED
    bundle = Path(ca_bundle)
    pems = sorted(bundle.glob("*.pem")) if bundle.is_dir() else [bundle]
    context.load_verify_locations(cadata="".join(p.read_text() for p in pems))
    return context


def _multipart(field: str, path: Path) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{path.name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    body = head + path.read_bytes() + f"\r\n--{boundary}--\r\n".encode()
    return body, f"multipart/form-data; boundary={boundary}"


class Swci:
    """A connection to one SWCI web server.

    Args:
        swciIp: host name or address of the swci server.
        port: its web port (default 30306).
        clientCert: client certificate (PEM; may hold the key too); turns on https with mutual TLS.
        clientPKey: the key of ``clientCert`` when it is a separate file.
        clientCABundle: the swarm's CA (PEM file or directory) to verify the server; without it the server
            is not verified, as in the reference (``$REQUESTS_CA_BUNDLE`` is used when set).
        logger: a logger to use instead of the ``swci-web`` one.
        logLv: level of the ``swci-web`` logger.
        enableCaching: cache the answers of the listing and info commands.
    """

    def __init__(
        self,
        swciIp: str,  # noqa: N803 - the reference's argument names
        port: int = 30306,
        clientCert: str | None = None,  # noqa: N803
        clientPKey: str | None = None,  # noqa: N803
        clientCABundle: str | None = None,  # noqa: N803
        logger: logging.Logger | None = None,
        logLv: int = logging.WARNING,  # noqa: N803
        enableCaching: bool = True,  # noqa: N803
    ) -> None:
        self._logger = logger if isinstance(logger, logging.Logger) else _default_logger(logLv)
        if swciIp is None:
            self._fail_construction("SWCI IP not provided!")
        if not isinstance(port, int) or isinstance(port, bool):
            self._fail_construction("SWCI Port not Integer!")
        self._context: ssl.SSLContext | None = None
        scheme = "http"
        if clientCert is not None:
            ca_bundle = clientCABundle or os.environ.get("REQUESTS_CA_BUNDLE")
            self._context = _tls_context(clientCert, clientPKey, ca_bundle, self._logger)
            scheme = "https"
        self._base = f"{scheme}://{swciIp}:{port}"
        self._caching = enableCaching
        self._cache: dict[str, list[str]] = {}
        self._error: list[str] | None = None
        self._logger.info("SWCI url prefix = %s/exec?cmd=", self._base)

    def _fail_construction(self, message: str) -> None:
        self._logger.error(message)
        raise RuntimeError(message)

    # ------------------------------------------------------------------ plumbing
    def setLogLevel(self, logLv: str | int) -> None:  # noqa: N802, N803
        """Set the logger's level (``'DEBUG'``, ``'INFO'``, ... or a ``logging`` constant)."""
        names = {"CRITICAL": logging.CRITICAL, "ERROR": logging.ERROR, "INFO": logging.INFO}
        names["DEBUG"], names["WARNING"] = logging.DEBUG, logging.WARNING
        level = logLv if isinstance(logLv, int) else names.get(str(logLv).upper(), logging.WARNING)
        self._logger.setLevel(level)

    def getErrors(self) -> str | None:  # noqa: N802
        """The error of the last command, or None when it succeeded."""
        return "\n".join(self._error) if self._error else None

    def clearCache(self) -> None:  # noqa: N802
        """Forget the cached answers."""
        self._cache = {}

    def _post(self, path: str, body: bytes = b"", content_type: str | None = None) -> tuple[int, bytes]:
        request = urllib.request.Request(self._base + path, data=body, method="POST")  # noqa: S310
        if content_type is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT, context=self._context) as response:  # noqa: S310
                return int(response.status), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def _exec(self, command: str, *, cache: bool = False) -> list[str]:
        if cache and self._caching and command in self._cache:
            self._error = None
            return self._cache[command]
        self._logger.debug("POST %s/exec?cmd=%s", self._base, command)
        try:
            _status, raw = self._post("/exec?cmd=" + urllib.parse.quote(command, safe=""))
            content = json.loads(raw)["CONTENT"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return self._failed(f"ERROR : the request to {self._base} failed: {exc}")
        lines: list[str] = []
        for entry in content:
            if str(entry).startswith("ERROR "):
                return self._failed(str(entry))
            lines += [line.strip() for line in str(entry).splitlines()]
        if not lines:
            return self._failed("ERROR : Command did not produce output")
        if cache and self._caching:
            self._cache[command] = lines
        self._error = None
        return lines

    def _failed(self, message: str) -> list[str]:
        self._logger.error(message)
        self._error = [message]
        return []

    # ------------------------------------------------------------------ shell
    def ls(self, optStr: str = "") -> list[str]:  # noqa: N803
        """``LS [path]``."""
        return self._exec(f"ls {optStr}".strip())

    def pwd(self) -> list[str]:
        """``PWD``."""
        return self._exec("pwd")

    def sleep(self, sleepTime: float) -> list[str]:  # noqa: N803
        """``SLEEP <seconds>`` on the server."""
        return self._exec(f"sleep {sleepTime}")

    def cd(self, dirPath: str) -> list[str]:  # noqa: N803
        """``CD <dir>`` of the server's session."""
        return self._exec(f"cd {dirPath}")

    # ------------------------------------------------------------------ contexts
    def createContext(  # noqa: N802
        self,
        ctxName: str,  # noqa: N803
        ip: str | None = None,
        port: int = 30304,
        service: str | None = None,
    ) -> list[str]:
        """``CREATE CONTEXT <name> WITH IP <ip> <port>`` (or ``WITH SERVICE <service>``)."""
        if ip is None and service is None:
            raise RuntimeError("For creating context either IP or Service name is mandatory!")
        if ip is not None:
            lines = self._exec(f"create context {ctxName} with ip {ip} {int(port)}")
        else:
            lines = self._exec(f"create context {ctxName} with service {service}")
        if lines:
            self._cache.pop(_LIST_CONTEXTS, None)
        return lines

    def switchContext(self, ctxName: str) -> list[str]:  # noqa: N802, N803
        """``SWITCH CONTEXT <name>``."""
        return self._exec(f"switch context {ctxName}")

    def listContexts(self) -> list[str]:  # noqa: N802
        """``LIST CONTEXTS`` (cached)."""
        return self._exec(_LIST_CONTEXTS, cache=True)

    def getContextInfo(self, ctxName: str = "") -> list[str]:  # noqa: N802, N803
        """``GET CONTEXT INFO [name]`` (cached)."""
        return self._exec((_GET_CONTEXT_INFO + ctxName).strip(), cache=True)

    # ------------------------------------------------------------------ contracts
    def createTrainingContract(self, ctName: str) -> list[str]:  # noqa: N802, N803
        """``CREATE CONTRACT <name>``."""
        lines = self._exec(f"create contract {ctName}")
        if lines:
            self._cache.pop(_LIST_CONTRACTS, None)
        return lines

    def listTrainingContracts(self) -> list[str]:  # noqa: N802
        """``LIST CONTRACTS`` (cached)."""
        return self._exec(_LIST_CONTRACTS, cache=True)

    def getTrainingContractInfo(self, ctName: str) -> list[str]:  # noqa: N802, N803
        """``GET CONTRACT INFO <name>`` (cached)."""
        return self._exec(_GET_CONTRACT_INFO + ctName, cache=True)

    def getTrainingContractStatus(self, ctName: str) -> list[str]:  # noqa: N802, N803
        """``GET CONTRACT STATUS <name>``."""
        return self._exec(f"get contract status {ctName}")

    def getTrainingContractPerformanceData(self, ctName: str) -> list[str]:  # noqa: N802, N803
        """``PERFDATA <name>``."""
        return self.perfdata(ctName)

    def perfdata(self, trainingBlackboardName: str) -> list[str]:  # noqa: N803
        """``PERFDATA <name>``."""
        return self._exec(f"perfdata {trainingBlackboardName}")

    def resetTrainingContract(self, ctName: str = DEFAULT_CONTRACT) -> list[str]:  # noqa: N802, N803
        """``RESET CONTRACT <name>``."""
        return self._exec(f"reset contract {ctName}")

    # ------------------------------------------------------------------ tasks
    def uploadTaskDefintion(self, taskFilePath: str | os.PathLike[str]) -> str:  # noqa: N802, N803
        """Upload a task definition file into the server's directory (the reference's spelling).

        Returns the server's answer (JSON text); raises RuntimeError when the file or the upload fails.
        """
        path = Path(taskFilePath).resolve()
        if not path.is_file():
            raise RuntimeError(f"Task definition file not found : {path}")
        body, content_type = _multipart("file", path)
        try:
            status, raw = self._post("/uploadTaskDef", body, content_type)
        except OSError as exc:
            raise RuntimeError(f"Task definition file upload failed: {exc}") from None
        text = raw.decode("utf-8", errors="replace")
        if status != 200:
            raise RuntimeError(f"Task definition file upload failed ({status}): {text}")
        return text

    def createTaskFrom(self, yamlFileName: str) -> list[str]:  # noqa: N802, N803
        """``CREATE TASK FROM <file>`` (a path on the server; see ``uploadTaskDefintion``)."""
        lines = self._exec(f"create task from {yamlFileName}")
        if lines:
            self._cache.pop(_LIST_TASKS, None)
        return lines

    def finalizeTask(self, taskName: str) -> list[str]:  # noqa: N802, N803
        """``FINALIZE TASK <name>``."""
        return self._exec(f"finalize task {taskName}")

    def deleteTask(self, taskName: str) -> list[str]:  # noqa: N802, N803
        """``DELETE TASK <name>``."""
        lines = self._exec(f"delete task {taskName}")
        if lines:
            for key in (_LIST_TASKS, _GET_TASK_BODY + taskName, _GET_TASK_INFO + taskName):
                self._cache.pop(key, None)
        return lines

    def registerTask(self, yamlFileName: str, finalize: bool = True) -> list[str]:  # noqa: N802, N803
        """``CREATE TASK FROM`` and (by default) ``FINALIZE TASK``: ``['Registered Task : <name>']``."""
        lines = self.createTaskFrom(yamlFileName)
        if not lines:
            return lines
        name = next((line.split(":", 1)[1].strip() for line in lines if "Task Registered" in line), None)
        name = name or next((_already_registered(line) for line in lines if _already_registered(line)), None)
        if not finalize or name is None:
            return lines
        if not self.finalizeTask(name):
            return []
        return [f"Registered Task : {name}"]

    def getTaskInfo(self, taskName: str) -> list[str]:  # noqa: N802, N803
        """``GET TASK INFO <name>`` (cached)."""
        return self._exec(_GET_TASK_INFO + taskName, cache=True)

    def getTaskBody(self, taskName: str) -> list[str]:  # noqa: N802, N803
        """``GET TASK BODY <name>`` (cached)."""
        return self._exec(_GET_TASK_BODY + taskName, cache=True)

    def listTasks(self) -> list[str]:  # noqa: N802
        """``LIST TASKS`` (cached)."""
        return self._exec(_LIST_TASKS, cache=True)

    # ------------------------------------------------------------------ taskrunners
    def assignTask(self, taskName: str, trName: str, peers: int) -> list[str]:  # noqa: N802, N803
        """``ASSIGN TASK <task> TO <taskrunner> WITH <peers> PEERS``."""
        return self._exec(f"assign task {taskName} to {trName} with {int(peers)} peers")

    def getTaskRunnerStatus(self, trName: str) -> list[str]:  # noqa: N802, N803
        """``GET TASKRUNNER STATUS <name>``."""
        return self._exec(f"get taskrunner status {trName}")

    def getTaskRunnerPeerStatus(self, trName: str, idx: int) -> list[str]:  # noqa: N802, N803
        """``GET TASKRUNNER PEER STATUS <name> <index>``."""
        return self._exec(f"get taskrunner peer status {trName} {int(idx)}")

    def getTaskRunnerInfo(self, trName: str) -> list[str]:  # noqa: N802, N803
        """``GET TASKRUNNER INFO <name>`` (cached)."""
        return self._exec(_GET_TASKRUNNER_INFO + trName, cache=True)

    def listTaskRunners(self) -> list[str]:  # noqa: N802
        """``LIST TASKRUNNERS`` (cached)."""
        return self._exec(_LIST_TASKRUNNERS, cache=True)

    def resetTaskRunner(self, trName: str = DEFAULT_TASKRUNNER) -> list[str]:  # noqa: N802, N803
        """``RESET TASKRUNNER <name>``."""
        return self._exec(f"reset taskrunner {trName}")

    def isTaskDone(self, trName: str) -> bool:  # noqa: N802, N803
        """True when the taskrunner's TASK_STATE is COMPLETE, ERROR or IDLE; RuntimeError if unknown."""
        state = self._task_state(trName)
        return state in _DONE_STATES

    def _task_state(self, runner: str) -> str | None:
        lines = self.getTaskRunnerStatus(runner)
        if not lines:
            raise RuntimeError(self.getErrors())
        return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("TASK_STATE")), None)

    def executeTask(  # noqa: N802
        self,
        taskName: str,  # noqa: N803
        tr: str = DEFAULT_TASKRUNNER,
        peers: int = 1,
        pollWaitInSec: float = 120,  # noqa: N803
        resetTROnSuccess: bool = True,  # noqa: N803
    ) -> list[str]:
        """Assign a task, poll until it is done, print its status and each peer's, reset on success."""
        if not self.assignTask(taskName, tr, peers):
            self._logger.error("Could not assign task %s on %s", taskName, tr)
            return []
        print(f"Assigned task {taskName} on {tr} for execution")
        while not self.isTaskDone(tr):
            print(f"Waiting for task {taskName} to complete")
            time.sleep(pollWaitInSec)
        report = self.getTaskRunnerStatus(tr)
        success = self._task_state(tr) == "COMPLETE"
        report.append("=" * 40)
        for index in range(peers):
            report += [*self.getTaskRunnerPeerStatus(tr, index), "=" * 40]
        for line in report:
            print(line)
        if resetTROnSuccess and success:
            self.resetTaskRunner(tr)
        return report

    # ------------------------------------------------------------------ nodes
    def listNodes(self) -> list[str]:  # noqa: N802
        """``LIST NODES``: a header, then one comma-separated line per live node."""
        return self._exec("list nodes")

    def plotTopology(  # noqa: N802
        self,
        SNColour: str = "#ADD8E6",  # noqa: N803
        SWOPColor: str = "#33FF33",  # noqa: N803
        SLColor: str = "#FFCCCB",  # noqa: N803
        attrs: list[str] | None = None,
    ) -> Any:
        """Draw the nodes (child to ``ParentUUID``) with networkx and matplotlib; returns the graph."""
        import networkx as nx  # noqa: PLC0415 - optional, as in the reference

        lines = self.listNodes()
        graph = nx.Graph()
        colours = {"SN": SNColour, "SENTINEL": SNColour, "SWOP": SWOPColor, "SL": SLColor}
        for line in lines[1:]:
            fields = [field.strip() for field in line.split(",")]
            if len(fields) < 7:
                continue
            kind, host, _port, name, uid, parent, _alive = fields[:7]
            values = dict(zip(("Port", "ContainerName", "UUID", "ParentUUID"), fields[2:6], strict=True))
            label = "\n".join([f"{kind}\n{host}", *(values[a] for a in attrs or [] if a in values)])
            graph.add_node(uid, label=label, color=colours.get(kind, "#1f78b4"), name=name)
            if parent:
                graph.add_edge(parent, uid)
        try:
            nx.draw_networkx(
                graph,
                labels=nx.get_node_attributes(graph, "label"),
                node_color=[graph.nodes[n].get("color", "#1f78b4") for n in graph.nodes],
            )
        except ImportError as exc:
            self._logger.warning("plotTopology cannot draw without matplotlib: %s", exc)
        return graph


def _already_registered(line: str) -> str | None:
    """The task name of ``Task <name> already registered ...`` (a re-run of an init script)."""
    words = line.split()
    if len(words) >= 3 and words[0] == "Task" and words[2] == "already":
        return words[1]
    return None
