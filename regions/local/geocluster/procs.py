"""Processes: free ports, spawning into process groups with pid files, stopping, waiting; the JVM tools."""

from __future__ import annotations

from .common import *  # noqa: F401,F403


def free_port() -> int:
    """A free port in 20000-24999: below the kernel's ephemeral range, so no outgoing
    connection takes it while its process restarts (a `bind(0)` port can be), and below
    the tests' range (25000 up to the ephemeral range)."""
    for _ in range(1000):
        port = random.randrange(20000, 25000)
        if port in HANDED_OUT:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        HANDED_OUT.add(port)
        return port
    die("no free port in 20000-24999")


# ports free_port gave out in this run (not bound yet by their process)
HANDED_OUT: set[int] = set()


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not alive
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        return state != "Z"
    except OSError:
        return False


def wait_for(what: str, check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    die(f"{what} not ready after {timeout:.0f}s (logs in {LOGS})")


def spawn(name: str, argv: list[str], env: dict | None = None) -> int:
    """Start a daemon in its own process group, stdout+stderr to logs/<name>.log."""
    LOGS.mkdir(parents=True, exist_ok=True)
    PIDS.mkdir(parents=True, exist_ok=True)
    out = open(LOGS / f"{name}.log", "ab")
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            env=dict(os.environ, **(env or {})))
    (PIDS / name).write_text(str(proc.pid))
    return proc.pid


def stop_pid(name: str, pid: int, grace: float = 15.0) -> None:
    if not pid_alive(pid):
        return
    try:
        os.killpg(pid, signal.SIGTERM)
        # one a drill or benchmark stopped (SIGSTOP) handles SIGTERM once continued
        os.killpg(pid, signal.SIGCONT)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.1)
    if pid_alive(pid):
        log(f"{name} (pid {pid}) ignored SIGTERM; killing")
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    return str(Path(home) / "bin" / "java") if home else "java"


def kafka_cp() -> str:
    return str(KAFKA_LIBS / "*")


def log4j_config() -> Path:
    path = RUN / "log4j2.properties"
    path.write_text(
        "status = warn\n"
        "appender.out.type = Console\n"
        "appender.out.name = out\n"
        "appender.out.layout.type = PatternLayout\n"
        "appender.out.layout.pattern = [%d] %p %m (%c)%n\n"
        "rootLogger.level = info\n"
        "rootLogger.appenderRef.out.ref = out\n"
        "logger.kafka.name = org.apache.kafka\n"
        "logger.kafka.level = warn\n"
        "logger.mirror.name = org.apache.kafka.connect.mirror\n"
        "logger.mirror.level = info\n"
        "logger.state.name = state.change.logger\n"
        "logger.state.level = warn\n")
    return path


def java_tool(main: str, *args: str, check: bool = True, timeout: float = 60):
    argv = [java(), "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            f"-Dlog4j2.configurationFile={RUN / 'log4j2.properties'}", "-cp", kafka_cp(),
            main, *args]
    out = subprocess.run(argv, timeout=timeout, capture_output=True, text=True)
    if check and out.returncode != 0:
        die(f"{main} {' '.join(args)} failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    return out
