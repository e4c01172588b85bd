# The two commands of the README: `make demo` and `make test`.
.PHONY: demo test test-systemd test-live test-gpu test-slurm-block bench install uninstall wheelhouse

demo:
	@bash scripts/setup.sh
	@.venv/bin/python -m topod.demo

test:
	@bash scripts/setup.sh --test
	@.venv/bin/python -m pytest -q

# topod under a real systemd: a Debian 12 container (debootstrap, cached in
# build/systemd-rootfs) booted with systemd-nspawn, topod installed in it offline from the
# wheelhouse as docs/operations.md says, tests/systemd run against it. Needs root; skips
# (status 0, one "skipped:" line) where it cannot run. See docs/operations.md, "Running
# under systemd".
test-systemd:
	@bash scripts/systemd-tier.sh run

# topod on a real kernel: a two-node Debian 12 guest under QEMU (TCG), its image built once
# into build/live-image (debootstrap, mkfs.ext4 -d; rebuilt when its recipe changes),
# topod installed in it offline from the wheelhouse as docs/operations.md says, tests/live
# run against it (IRQs written for real, managed vectors, hot-plug over QMP, leases and
# cgroup v2). Needs root; skips (status 0, one "skipped:" line) where it cannot run.
test-live:
	@bash scripts/live-tier.sh run

# On a GPU server: topod's GPUs, NUMA nodes, links and NIC pairing against the vendor's
# own tools (`nvidia-smi topo -m`, `rocm-smi --showtopo`), one MISMATCH line per
# disagreement (status 1). Skips (status 0, one "skipped:" line) on a host without GPUs.
test-gpu:
	@bash scripts/setup.sh --test >/dev/null
	@.venv/bin/python -m topod.conformance

# Block topology files against a real slurmctld with topology/block (Slurm >= 24.05, which
# Debian 12 lacks): built once from a SchedMD/slurm checkout (SLURM_SRC=dir, 7-10 minutes)
# into SLURM_PREFIX (default build/slurm, then reused), or an existing install named by
# SLURM_PREFIX. See docs/exports.md, "topology.conf".
SLURM_SRC ?=
SLURM_PREFIX ?= $(CURDIR)/build/slurm
test-slurm-block:
	@bash scripts/setup.sh --test
	@if [ ! -x "$(SLURM_PREFIX)/sbin/slurmctld" ]; then \
		if [ -z "$(SLURM_SRC)" ] || [ ! -x "$(SLURM_SRC)/configure" ]; then \
			echo "no slurmctld in SLURM_PREFIX=$(SLURM_PREFIX): set SLURM_SRC to a SchedMD/slurm checkout (>= 24.05) to build it there" >&2; exit 2; fi; \
		echo "building Slurm from $(SLURM_SRC) into $(SLURM_PREFIX) (once; 7-10 minutes)"; mkdir -p "$(CURDIR)/build"; \
		cd "$(SLURM_SRC)" && ./configure --prefix="$(SLURM_PREFIX)" --without-munge > "$(CURDIR)/build/slurm-configure.log" 2>&1 \
			&& nice make -j"$$(nproc)" -C src > "$(CURDIR)/build/slurm-make.log" 2>&1 \
			&& make -C src install > "$(CURDIR)/build/slurm-install.log" 2>&1 \
			|| { echo "Slurm build failed: see build/slurm-*.log" >&2; exit 1; }; fi
	TOPOD_SLURM_PREFIX="$(SLURM_PREFIX)" .venv/bin/python -m pytest -q -rs tests/host/test_slurm_block_slurmctld.py

bench:
	@bash scripts/setup.sh --test
	@for b in bench/*.py; do echo "== $$b"; .venv/bin/python $$b || exit 1; done

# System-wide install (as root, or into a staging tree with DESTDIR=): a venv of the
# system python3 in $(PREFIX)/lib/topod, entry points in $(PREFIX)/bin, units,
# sysusers/tmpfiles snippets, man pages and shell completions (when this version has
# them); the config is never overwritten. Everything installed points at $(PREFIX), never
# at $(DESTDIR): a staged tree works once moved to /. WHEELHOUSE=dir installs offline
# from `make wheelhouse`'s wheels (`pip --no-index --find-links`), for air-gapped nodes.
PREFIX ?= /usr
DESTDIR ?=
PYTHON ?= python3
WHEELHOUSE ?=
WHEELHOUSE_DIR ?= dist/wheelhouse
SYSCONFDIR ?= /etc
UNITDIR ?= /usr/lib/systemd/system
SYSUSERSDIR ?= /usr/lib/sysusers.d
TMPFILESDIR ?= /usr/lib/tmpfiles.d
MANDIR ?= $(PREFIX)/share/man
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR ?= $(PREFIX)/share/zsh/vendor-completions
FISHCOMPDIR ?= $(PREFIX)/share/fish/vendor_completions.d

VENV := $(PREFIX)/lib/topod
STAGED := $(DESTDIR)$(VENV)
MANIFEST := $(STAGED)/installed-files
# -I: the installed code only, never ./topod of a source tree the command runs in
RUN := $(STAGED)/bin/python -I
PIP := $(RUN) -m pip --disable-pip-version-check --quiet
PIP_SOURCE := $(if $(WHEELHOUSE),--no-index --find-links $(abspath $(WHEELHOUSE)) topod,.)

install:
	@case "$(PREFIX)" in /*) ;; *) echo "PREFIX must be an absolute path, not '$(PREFIX)'" >&2; exit 2;; esac
	@if [ -n "$(WHEELHOUSE)" ] && ! ls "$(WHEELHOUSE)"/topod-*.whl >/dev/null 2>&1; then \
		echo "no topod wheel in WHEELHOUSE=$(WHEELHOUSE): run 'make wheelhouse' where PyPI is reachable" >&2; exit 2; fi
	$(PYTHON) -m venv $(STAGED)
	@# setuptools builds in ./build/lib and never drops a module deleted since: start clean
	$(if $(WHEELHOUSE),,rm -rf build/lib)
	$(PIP) install --no-compile $(PIP_SOURCE)
	@# pip keeps a local wheel of the same version: an upgrade from a wheelhouse must replace it
	$(if $(WHEELHOUSE),$(PIP) install --no-compile --no-deps --force-reinstall $(PIP_SOURCE))
	@# The venv was made at $(STAGED): its scripts' #! lines, pyvenv.cfg and activate
	@# scripts name that path; rewrite them to $(VENV), where the tree will live.
	$(if $(DESTDIR),grep -rlIF -- '$(STAGED)' $(STAGED)/bin $(STAGED)/pyvenv.cfg | xargs -r sed -i 's|$(STAGED)|$(VENV)|g')
	$(RUN) -m compileall -q -f -j 0 $(if $(DESTDIR),-s '$(DESTDIR)' -p /) $(STAGED)/lib
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(TMPFILESDIR) \
		$(DESTDIR)$(SYSCONFDIR)/topod $(DESTDIR)$(PREFIX)/share/topod $(DESTDIR)$(PREFIX)/share/doc/topod
	ln -sfn $(VENV)/bin/topod $(DESTDIR)$(PREFIX)/bin/topod
	ln -sfn $(VENV)/bin/topoctl $(DESTDIR)$(PREFIX)/bin/topoctl
	sed 's|=/usr/bin/topod |=$(PREFIX)/bin/topod |; s|=/usr/bin/topoctl |=$(PREFIX)/bin/topoctl |; s|/etc/topod/|$(SYSCONFDIR)/topod/|g' systemd/topod.service \
		> $(DESTDIR)$(UNITDIR)/topod.service && chmod 0644 $(DESTDIR)$(UNITDIR)/topod.service
	install -m 0644 systemd/topod.socket $(DESTDIR)$(UNITDIR)/topod.socket
	install -m 0644 systemd/topod.sysusers $(DESTDIR)$(SYSUSERSDIR)/topod.conf
	install -m 0644 systemd/topod.tmpfiles $(DESTDIR)$(TMPFILESDIR)/topod.conf
	install -m 0644 etc/topod.toml $(DESTDIR)$(PREFIX)/share/topod/topod.toml.default
	install -m 0644 LICENSE $(DESTDIR)$(PREFIX)/share/doc/topod/LICENSE
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/topod/topod.toml ]; then \
		echo "kept $(SYSCONFDIR)/topod/topod.toml (the new default is $(PREFIX)/share/topod/topod.toml.default)"; \
	else install -m 0644 etc/topod.toml $(DESTDIR)$(SYSCONFDIR)/topod/topod.toml && echo "installed $(SYSCONFDIR)/topod/topod.toml"; fi
	@printf '%s\n' $(PREFIX)/bin/topod $(PREFIX)/bin/topoctl $(UNITDIR)/topod.service $(UNITDIR)/topod.socket \
		$(SYSUSERSDIR)/topod.conf $(TMPFILESDIR)/topod.conf $(PREFIX)/share/topod/topod.toml.default \
		$(PREFIX)/share/doc/topod/LICENSE > $(MANIFEST)
	@set -e; if $(RUN) -c 'import importlib.util as u, sys; sys.exit(u.find_spec("topod.cli.manpages") is None)'; then \
		pages=$$(mktemp -d); trap 'rm -rf "$$pages"' EXIT; \
		$(RUN) -m topod.cli.manpages "$$pages"; \
		found=0; for page in $$(find "$$pages" -type f -name '*.[1-8]' | sort); do \
			name=$$(basename "$$page"); section=$${name##*.}; found=$$((found + 1)); \
			install -d $(DESTDIR)$(MANDIR)/man$$section; \
			install -m 0644 "$$page" $(DESTDIR)$(MANDIR)/man$$section/$$name; \
			echo $(MANDIR)/man$$section/$$name >> $(MANIFEST); done; \
		[ $$found -gt 0 ] || { echo "topod.cli.manpages wrote no NAME.<section> page into $$pages" >&2; exit 1; }; \
		echo "installed $$found man pages under $(MANDIR)"; \
	else echo "skipped: man pages (this version has no topod.cli.manpages)"; fi
	@set -e; if $(RUN) -c 'import importlib.util as u, sys; sys.exit(u.find_spec("topod.cli.completion") is None)'; then \
		install -d $(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR) $(DESTDIR)$(FISHCOMPDIR); \
		$(RUN) -m topod.cli.topoctl completion bash > $(DESTDIR)$(BASHCOMPDIR)/topoctl; \
		$(RUN) -m topod.cli.topoctl completion zsh > $(DESTDIR)$(ZSHCOMPDIR)/_topoctl; \
		$(RUN) -m topod.cli.topoctl completion fish > $(DESTDIR)$(FISHCOMPDIR)/topoctl.fish; \
		chmod 0644 $(DESTDIR)$(BASHCOMPDIR)/topoctl $(DESTDIR)$(ZSHCOMPDIR)/_topoctl $(DESTDIR)$(FISHCOMPDIR)/topoctl.fish; \
		printf '%s\n' $(BASHCOMPDIR)/topoctl $(ZSHCOMPDIR)/_topoctl $(FISHCOMPDIR)/topoctl.fish >> $(MANIFEST); \
		echo "installed bash, zsh and fish completions for topoctl"; \
	else echo "skipped: shell completions (this version has no topod.cli.completion)"; fi
	@echo "installed topod $$($(RUN) -c 'import topod; print(topod.__version__)') in $(DESTDIR)$(VENV)"
	@echo "now: systemd-sysusers && systemd-tmpfiles --create && systemctl daemon-reload && systemctl enable --now topod.socket topod.service"

# Removes what install put there (listed in $(VENV)/installed-files) and the venv; keeps
# $(SYSCONFDIR)/topod/topod.toml and /var/lib/topod (leases). With DESTDIR set it leaves the
# running system's services alone.
uninstall:
	@if [ -z "$(DESTDIR)" ] && command -v systemctl >/dev/null; then \
		systemctl disable --now topod.service topod.socket || echo "systemctl could not stop topod (continuing)"; fi
	@if [ -f $(MANIFEST) ]; then \
		while read -r path; do rm -f "$(DESTDIR)$$path"; done < $(MANIFEST); fi
	rm -f $(DESTDIR)$(PREFIX)/bin/topod $(DESTDIR)$(PREFIX)/bin/topoctl \
		$(DESTDIR)$(UNITDIR)/topod.service $(DESTDIR)$(UNITDIR)/topod.socket \
		$(DESTDIR)$(SYSUSERSDIR)/topod.conf $(DESTDIR)$(TMPFILESDIR)/topod.conf
	rm -rf $(STAGED)
	@for dir in $(DESTDIR)$(PREFIX)/share/topod $(DESTDIR)$(PREFIX)/share/doc/topod; do \
		if [ -d "$$dir" ]; then rmdir --ignore-fail-on-non-empty "$$dir"; fi; done
	@echo "kept: $(SYSCONFDIR)/topod/topod.toml and /var/lib/topod (leases); remove them by hand if wanted"

# topod's wheel and every dependency's, for `make install WHEELHOUSE=$(WHEELHOUSE_DIR)` on
# nodes without PyPI. Build it with the same python3 (version, architecture) as the nodes.
wheelhouse:
	[ -x build/wheelhouse-venv/bin/python ] || $(PYTHON) -m venv build/wheelhouse-venv
	rm -rf build/lib
	build/wheelhouse-venv/bin/python -m pip --disable-pip-version-check --quiet wheel -w $(WHEELHOUSE_DIR) .
	@echo "$(WHEELHOUSE_DIR): $$(ls $(WHEELHOUSE_DIR) | wc -l) wheels; on the node: make install WHEELHOUSE=$(WHEELHOUSE_DIR)"
