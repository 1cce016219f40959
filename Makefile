# The two commands of the README.
.PHONY: demo demo-short test

demo:  ## Airflow 3 + Edge executor, the Sentinel and autoscaled workers, end to end
	bash demo/run.sh

demo-short:  ## the same with a small burst (what CI runs)
	bash demo/run.sh --short

test:  ## the test command
	bash tests/run.sh
