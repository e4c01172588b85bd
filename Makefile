# The two commands of the README: `make demo` and `make test`.
.PHONY: demo test bench install uninstall

demo:
	@bash scripts/setup.sh
	@.venv/bin/python -m topod.demo

test:
	@bash scripts/setup.sh --test
	@.venv/bin/python -m pytest -q

bench:
	@bash scripts/setup.sh --test
	@for b in bench/*.py; do echo "== $$b"; .venv/bin/python $$b || exit 1; done

# System-wide install (as root): a venv in $(PREFIX)/lib/topod, entry points in
# $(PREFIX)/bin, units, sysusers/tmpfiles snippets; the config is never overwritten.
PREFIX ?= /usr
DESTDIR ?=
install:
	python3 -m venv $(DESTDIR)$(PREFIX)/lib/topod
	$(DESTDIR)$(PREFIX)/lib/topod/bin/pip install --quiet .
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)/usr/lib/systemd/system $(DESTDIR)/usr/lib/sysusers.d \
		$(DESTDIR)/usr/lib/tmpfiles.d $(DESTDIR)/etc/topod
	ln -sf $(PREFIX)/lib/topod/bin/topod $(DESTDIR)$(PREFIX)/bin/topod
	ln -sf $(PREFIX)/lib/topod/bin/topoctl $(DESTDIR)$(PREFIX)/bin/topoctl
	install -m 0644 systemd/topod.service systemd/topod.socket $(DESTDIR)/usr/lib/systemd/system/
	install -m 0644 systemd/topod.sysusers $(DESTDIR)/usr/lib/sysusers.d/topod.conf
	install -m 0644 systemd/topod.tmpfiles $(DESTDIR)/usr/lib/tmpfiles.d/topod.conf
	[ -e $(DESTDIR)/etc/topod/topod.toml ] || install -m 0644 etc/topod.toml $(DESTDIR)/etc/topod/topod.toml
	@echo "now: systemd-sysusers && systemd-tmpfiles --create && systemctl daemon-reload && systemctl enable --now topod.socket topod.service"

uninstall:
	-systemctl disable --now topod.service topod.socket
	rm -f $(DESTDIR)/usr/lib/systemd/system/topod.service $(DESTDIR)/usr/lib/systemd/system/topod.socket \
		$(DESTDIR)/usr/lib/sysusers.d/topod.conf $(DESTDIR)/usr/lib/tmpfiles.d/topod.conf \
		$(DESTDIR)$(PREFIX)/bin/topod $(DESTDIR)$(PREFIX)/bin/topoctl
	rm -rf $(DESTDIR)$(PREFIX)/lib/topod
	@echo "kept: /etc/topod/topod.toml and /var/lib/topod (leases); remove them by hand if wanted"
