# SPDX-License-Identifier: Apache-2.0
# The data keys of both programs: a config that names data files the
# program would not read, or lacks a file its format needs, or a model task
# that does not fit the class count, exits 2 naming the key -- nothing is
# silently ignored.
source tests/integration/lib.sh

expect2() { # DESCRIPTION PATTERN COMMAND...
	local what=$1 pat=$2
	shift 2
	local st=0
	"$@" >"$T/out.txt" 2>&1 || st=$?
	[ "$st" -eq 2 ] || { cat "$T/out.txt"; fail "$what: exit $st, expected 2"; }
	grep -qE -- "$pat" "$T/out.txt" || { cat "$T/out.txt"; fail "$what: message lacks '$pat'"; }
	echo "ok: $what: $(grep -E -- "$pat" "$T/out.txt" | head -1 | sed 's/.*ERROR //')"
}

worker() { # NAME, then the data section's lines on stdin
	{
		printf 'coordinator: tcp://127.0.0.1:1\nname: w0\ndata:\n'
		sed 's/^/  /'
	} >"$T/$1.yaml"
}

worker w1 <<'YAML'
train: hospital.csv
YAML
expect2 "a training file without data.dataset files" \
	"w1.yaml: data.train is set, but data.dataset is not files" \
	"$B/fedbox-worker" --config "$T/w1.yaml"

worker w2 <<'YAML'
dataset: files
YAML
expect2 "data.dataset files without a file" \
	"w2.yaml: data.dataset files needs data.train" \
	"$B/fedbox-worker" --config "$T/w2.yaml"

worker w3 <<'YAML'
dataset: files
format: npy
train: x.npy
YAML
expect2 "npy features without labels" \
	"w3.yaml: data.format npy needs data.train_labels" \
	"$B/fedbox-worker" --config "$T/w3.yaml"

worker w4 <<'YAML'
dataset: files
train: a.csv
normalize: file
YAML
expect2 "normalize file without the file" \
	"w4.yaml: data.normalize file needs data.normalize_file" \
	"$B/fedbox-worker" --config "$T/w4.yaml"

worker w5 <<'YAML'
dataset: files
train: a.csv
format: parquet
YAML
expect2 "an unknown format" "w5.yaml:6:11: data.format" \
	"$B/fedbox-worker" --config "$T/w5.yaml"

worker w6 <<'YAML'
dataset: files
format: idx
train: img.gz
train_labels: lab.gz
task: regression
YAML
expect2 "idx regression" "w6.yaml: data.format idx holds class labels" \
	"$B/fedbox-worker" --config "$T/w6.yaml"

cat >"$T/c1.yaml" <<'YAML'
model:
  task: regression
YAML
expect2 "regression with 10 classes" \
	"c1.yaml:[0-9]+:[0-9]+: model.(classes|task): model.classes 10 does not fit model.task regression" \
	"$B/fedbox-coordinator" --config "$T/c1.yaml"

cat >"$T/c2.yaml" <<'YAML'
evaluation:
  dataset: files
YAML
expect2 "evaluation files without a file" \
	"c2.yaml: evaluation.dataset files needs evaluation.file" \
	"$B/fedbox-coordinator" --config "$T/c2.yaml"

cat >"$T/c3.yaml" <<'YAML'
evaluation:
  file: test.csv
YAML
expect2 "an evaluation file without evaluation.dataset files" \
	"c3.yaml: evaluation.file is set, but evaluation.dataset is not files" \
	"$B/fedbox-coordinator" --config "$T/c3.yaml"
echo "data_config: all refused as expected"
