# Thin wrapper: the real work is in regions/local/cluster.py and scripts/.
# The cargo target directory lives outside the clone so repeat builds (and CI) are warm.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/geostate/target
CLUSTER := python3 regions/local/cluster.py

.PHONY: demo test simulate install build up down status top lint fmt bench jepsen drills

## The main job: start the local regions, run the surge-pricing workload for a minute,
## print the table (events per region, replication lag, identical state or not).
## UDF=python|go: the surge multipliers come from that SDK's example function, a gRPC
## sidecar per region (default: the built-in formula)
DEMO_SECONDS ?= 60
UDF ?= builtin
demo: up
	$(CLUSTER) udf $(UDF)
	@$(CLUSTER) status
	cargo build --locked --bin surge
	$(CARGO_TARGET_DIR)/debug/surge --cluster $(or $(GEOSTATE_RUN_DIR),regions/local/run)/cluster.json --seconds $(DEMO_SECONDS)

## The whole test suite, starting and stopping the infrastructure it needs
test:
	scripts/test.sh $(ARGS)

## More schedules of the deterministic simulation (tests/simulation.rs) than make test runs:
## SEEDS=N schedules from seed FIRST (default 1); no cluster needed
SEEDS ?= 20000
FIRST ?= 1
simulate:
	SIM_SEEDS=$(SEEDS) SIM_FIRST_SEED=$(FIRST) cargo test --locked --test simulation -- --nocapture

install:
	$(CLUSTER) install

build: install
	cargo build --workspace --all-targets --locked

## NODES=N: nodes per region of a new cluster (default 1)
## REGIONS=a,b,c: the regions of a new cluster (default us-east-1,eu-west-1)
up:
	$(CLUSTER) up

down:
	$(CLUSTER) down

status:
	$(CLUSTER) status

## The whole cluster on one screen, redrawn every 2 s (geostate top); Ctrl-C quits
top:
	$(CLUSTER) top

## A longer Jepsen-style run against the `make up` cluster (the smoke runs in `make test`)
WORKLOAD ?= pn-counter
DURATION ?= 300
SEED ?= 1
NEMESIS ?= pause-holder,kill,mirror
jepsen: up
	cargo build --locked -p geostate-jepsen
	$(CARGO_TARGET_DIR)/debug/jepsen --cluster $(or $(GEOSTATE_RUN_DIR),regions/local/run)/cluster.json \
		--workload $(WORKLOAD) --seconds $(DURATION) --seed $(SEED) --nemesis $(NEMESIS) \
		--out jepsen-tests/results/$(WORKLOAD)-seed$(SEED)

## Every failover drill against the `make up` cluster; reports in chaos/reports/
drills: up
	chaos/run all

## Benchmarks (release build) on a private local cluster; prints Markdown tables and
## writes them to bench/results/latest.md
bench:
	scripts/bench.sh $(ARGS)

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets --locked -- -D warnings

fmt:
	cargo fmt --all
