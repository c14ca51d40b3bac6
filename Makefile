# shadowline: the entry points. `make demo` and `make test` are the README's first two commands.
SHELL := /bin/bash
.DEFAULT_GOAL := help
ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
VENV := $(ROOT)/.venv
BIN := $(VENV)/bin
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(ROOT)/ansible.cfg
NODES ?= 3
INVENTORY ?= inventories/local

.PHONY: help setup runtime demo test lint build preflight testbed-up testbed-down deploy status teardown clean \
	drill bench-failover bench-client bench-fleet-scale ee-context sanity verify-engine-args standin-image gpu-proof

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 22

setup: $(BIN)/.stamp $(BIN)/shadowline collections/ansible_collections/shadowline/gms ## install the dev venv, the shadowline command and wire the collection (idempotent)

$(BIN)/.stamp: requirements/dev.lock
	scripts/setup-system
	test -x $(BIN)/python || /usr/bin/python3 -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements/dev.lock
	touch $@

# The shadowline command (pyproject.toml's console scripts: shadowline, shadowline-agent), installed editable so that
# .venv/bin/shadowline runs this checkout's library; the Slurm job template comes with it as package data.
$(BIN)/shadowline: pyproject.toml | $(BIN)/.stamp
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e $(ROOT)
	touch $@

collections/ansible_collections/shadowline/gms:
	mkdir -p collections/ansible_collections/shadowline
	ln -sfn ../../.. $@
	$(BIN)/ansible-galaxy collection install -r collections/requirements.yml -p collections >/dev/null

runtime: setup ## the engines' runtime (.runtime: Dynamo 1.6.1 on CPU) and the tiny local model
	scripts/install-runtime
	test -f .cache/models/tiny-llama/config.json || .runtime/bin/python scripts/make-tiny-model .cache/models/tiny-llama

testbed-up: setup ## boot NODES testbed hosts (default 3; REPLICAS=r: an inventory of r replicas; SPARES=s: its last s hosts spares; SLURM=1 adds Slurm)
	testbed/testbed.py up --nodes $(NODES) $(if $(REPLICAS),--replicas $(REPLICAS)) $(if $(SPARES),--spares $(SPARES)) $(if $(SLURM),--slurm)

testbed-down: ## remove the testbed and every trace of it
	testbed/testbed.py down

deploy: runtime ## site.yml on the testbed (make testbed-up first)
	$(BIN)/ansible-playbook -i inventories/testbed playbooks/site.yml

status: setup ## the status table of the testbed deployment
	PYTHONPATH=plugins/module_utils $(BIN)/python -m shadowline.cli status -i inventories/testbed

teardown: setup ## remove the testbed deployment (keeps the testbed)
	$(BIN)/ansible-playbook -i inventories/testbed playbooks/teardown.yml

drill: setup ## a failover drill on the testbed deployment under load (FAULT=kill-leader, see docs/drills.md)
	$(BIN)/ansible-playbook -i inventories/testbed playbooks/drill.yml -e fault=$(or $(FAULT),kill-leader)

bench-failover: runtime ## failover figures at 1, 2, 4, 8 testbed hosts (TRIALS=20; testbed instance 6)
	$(BIN)/python scripts/bench-failover --trials $(or $(TRIALS),20) $(if $(NODES_LIST),--nodes $(NODES_LIST))

bench-client: runtime ## NVIDIA's aiperf through a kill-leader and without, side by side (2 testbed hosts, instance 6; installs .aiperf once)
	$(BIN)/python scripts/bench-client

bench-fleet-scale: setup ## etcd's load and one failure's work at 16-1024 simulated agents, today's keys against the fleet's (SIZES=16,64)
	$(BIN)/python scripts/bench-fleet-scale $(if $(SIZES),--sizes $(SIZES))

standin-image: runtime ## the stand-in's runtime as a local OCI archive (build/standin-runtime.tar) for python_env_mode container
	$(BIN)/python scripts/build-standin-image

verify-engine-args: setup ## the real dynamo.vllm/vLLM parsers on every rendered engine command of the examples (scratch venv, minutes once)
	$(BIN)/python scripts/verify-engine-args

gpu-proof: ## what a GPU proves of the contract (OUT=build/gpu-proof; the machine's python3, no venv; docs/gpu-cluster.md)
	env PATH="$(subst $(BIN):,,$(PATH))" python3 scripts/gpu-proof --out $(or $(OUT),build/gpu-proof) $(GPU_PROOF_ARGS)

demo: runtime ## run the main job on the embedded default (root: boots a 2-host testbed)
	scripts/demo

test: runtime ## run the whole suite (unit, testbed, end-to-end, molecule, lint, build, ansible-test sanity)
	scripts/test-suite

lint: setup ## ansible-lint (production profile) and a Python byte-compile check
	$(BIN)/ansible-lint --profile production -q
	$(BIN)/ruff check --quiet plugins testbed tests monitoring scripts/show-plan scripts/bench-failover scripts/bench-client scripts/bench-fleet-scale scripts/verify-engine-args scripts/build-standin-image scripts/gpu-proof scripts/figures slurm/render slurm/drill
	python3 scripts/figures --check

sanity: setup ## ansible-test sanity on the built collection (scripts/sanity; tests/sanity/ignore-2.19.txt)
	scripts/sanity

build: setup ## build the collection tarball into build/
	mkdir -p build
	$(BIN)/ansible-galaxy collection build --force --output-path build . >/dev/null
	@ls build/*.tar.gz

preflight: setup ## run preflight against INVENTORY (default inventories/local)
	$(BIN)/ansible-playbook -i $(INVENTORY) playbooks/preflight.yml

clean: ## remove build output (keeps the venvs)
	rm -rf build .pytest_cache

ee-context: build ## an execution environment's build context for the built collection (build/ee-context)
	$(BIN)/ansible-builder create -f execution-environment.yml -c build/ee-context
