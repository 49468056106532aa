"""Installs what the cluster runs: Debian packages, Kafka and MirrorMaker 2 jars from Maven Central, the S3 server and grpcurl, the WAN delayer."""

from __future__ import annotations

from .common import *  # noqa: F401,F403


def install_apt() -> None:
    missing = [p for p, f in APT_PACKAGES.items() if not list(Path("/").glob(f.lstrip("/")))]
    if not missing:
        return
    if os.geteuid() != 0:
        die(f"missing system packages {missing}; install them with apt-get as root")
    log(f"installing system packages: {' '.join(missing)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env,
                   stdout=subprocess.DEVNULL)


KAFKA_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.geostate</groupId><artifactId>kafka-runtime</artifactId><version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>connect-mirror</artifactId><version>{kafka}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-api</artifactId><version>{slf4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>{log4j}</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId><version>{log4j}</version></dependency>
  </dependencies>
</project>
"""


def install_kafka() -> None:
    marker = KAFKA_LIBS / ".complete"
    if marker.exists():
        return
    if shutil.which("mvn") is None:
        die("Maven (mvn) is needed to fetch Apache Kafka from Maven Central")
    log(f"fetching Apache Kafka {KAFKA_VERSION} and MirrorMaker 2 from Maven Central")
    work = KAFKA_LIBS.parent
    work.mkdir(parents=True, exist_ok=True)
    (work / "pom.xml").write_text(
        KAFKA_POM.format(kafka=KAFKA_VERSION, slf4j=SLF4J_VERSION, log4j=LOG4J_VERSION))
    tmp = work / "libs.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run(["mvn", "-q", "-B", "-f", str(work / "pom.xml"),
                    "dependency:copy-dependencies", f"-DoutputDirectory={tmp}",
                    "-DincludeScope=runtime"], check=True)
    shutil.rmtree(KAFKA_LIBS, ignore_errors=True)
    tmp.rename(KAFKA_LIBS)
    marker.write_text(KAFKA_VERSION)


def install_s3() -> None:
    if S3S_FS.exists():
        return
    log(f"building the S3-compatible server s3s-fs {S3S_FS_VERSION} from crates.io")
    subprocess.run(["cargo", "install", "s3s-fs", "--version", S3S_FS_VERSION, "--features",
                    "binary", "--locked", "--root", str(S3S_FS.parents[1])], check=True)


def install_grpcurl() -> None:
    if GRPCURL.exists():
        return
    if shutil.which("go") is None:
        die("Go is needed to build grpcurl from the Go module proxy")
    log(f"building grpcurl {GRPCURL_VERSION} from the Go module proxy")
    subprocess.run(["go", "install", f"github.com/fullstorydev/grpcurl/cmd/grpcurl@{GRPCURL_VERSION}"],
                   check=True, env=dict(os.environ, GOBIN=str(GRPCURL.parent)))


def wan_delay_bin() -> Path:
    """Where the packet delayer of `net delay` is built: named by its sources' hash, so an
    edit builds it again."""
    sources = b"".join((WAN_DELAY_SRC / f).read_bytes() for f in ("main.go", "go.mod", "go.sum"))
    return CACHE / f"wan-delay-{hashlib.sha256(sources).hexdigest()[:10]}" / "wan-delay"


def install_wan_delay() -> None:
    out = wan_delay_bin()
    if out.exists():
        return
    if shutil.which("go") is None:
        die("Go is needed to build wan-delay from the Go module proxy")
    log("building wan-delay (chaos/wan-delay) from the Go module proxy")
    subprocess.run(["go", "build", "-o", str(out), "."], cwd=WAN_DELAY_SRC, check=True)


def cmd_install(_args: argparse.Namespace) -> None:
    install_apt()
    install_kafka()
    install_s3()
    install_grpcurl()
    install_wan_delay()
    log(f"installed: system packages, Kafka jars, S3 server, grpcurl, wan-delay ({CACHE})")
