# The two commands of the README: `make demo` and `make test`.
.PHONY: demo test bench install

demo:
	@bash scripts/setup.sh
	@.venv/bin/python -m topod.demo

test:
	@bash scripts/setup.sh --test
	@.venv/bin/python -m pytest -q

bench:
	@bash scripts/setup.sh --test
	@for b in bench/*.py; do echo "== $$b"; .venv/bin/python $$b || exit 1; done
