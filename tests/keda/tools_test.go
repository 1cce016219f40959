package kedacontract

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/yaml"
)

// The test binary doubles as the driver's helper when KEDA_CONTRACT_TOOL is set:
//
//	prepare        KEDA_CONTRACT_SCENARIO_DIR (holding rendered.yaml), KEDA_CONTRACT_NAME,
//	               KEDA_CONTRACT_NAMESPACE, KEDA_CONTRACT_VALUES (the chart's values.yaml first,
//	               then the scenario's files, joined by the OS path-list separator):
//	               writes scenario.json (what the values ask of each KEDA worker, read from the
//	               values, not from the rendered output) and provided.yaml (the Secrets the
//	               rendered objects reference but do not create, as an operator would provide them).
//	sentinel-files KEDA_CONTRACT_SCENARIO_DIR, KEDA_CONTRACT_OUT: the files the Sentinel Pod
//	               behind the trigger URLs sees — config.json (its config file, as JSON), tokens
//	               (its static tokens file, if any) and pod.json.
func TestMain(m *testing.M) {
	logf.SetLogger(funcr.New(func(prefix, args string) {
		fmt.Fprintln(os.Stderr, "keda:", prefix, args)
	}, funcr.Options{Verbosity: 0}))
	if tool := os.Getenv("KEDA_CONTRACT_TOOL"); tool != "" {
		var err error
		switch tool {
		case "prepare":
			err = prepareScenario(os.Getenv(envScenarioDir), os.Getenv("KEDA_CONTRACT_NAME"),
				os.Getenv("KEDA_CONTRACT_NAMESPACE"), filepath.SplitList(os.Getenv("KEDA_CONTRACT_VALUES")))
		case "sentinel-files":
			err = writeSentinelPodFiles(os.Getenv(envScenarioDir), os.Getenv("KEDA_CONTRACT_OUT"))
		default:
			err = fmt.Errorf("unknown KEDA_CONTRACT_TOOL %q", tool)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", tool, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// KEDA reads this once, at package init: without it KEDA does not report trigger
	// metadata keys its scaler does not know (a misspelt optional field would pass unnoticed).
	if os.Getenv("KEDA_CHECK_UNEXPECTED_SCALERS_PARAMS") != "enabled" {
		fmt.Fprintln(os.Stderr, "KEDA_CHECK_UNEXPECTED_SCALERS_PARAMS=enabled must be set (run through tests/keda/run.sh)")
		os.Exit(2)
	}
	os.Exit(m.Run())
}

type values = map[string]any

// overlay merges src into dst the way Helm layers values files: maps merge key by key, any
// other value replaces, null deletes.
func overlay(dst, src values) {
	for k, v := range src {
		switch sv := v.(type) {
		case nil:
			delete(dst, k)
		case map[string]any:
			if dv, ok := dst[k].(map[string]any); ok {
				overlay(dv, sv)
			} else {
				dst[k] = deepCopy(sv)
			}
		default:
			dst[k] = v
		}
	}
}

// mergeEntry merges a workers[] entry over workerDefaults as the chart documents: maps merge
// key by key, other values replace, a null leaves the default.
func mergeEntry(dst, src values) {
	for k, v := range src {
		switch sv := v.(type) {
		case nil:
		case map[string]any:
			if dv, ok := dst[k].(map[string]any); ok {
				mergeEntry(dv, sv)
			} else {
				dst[k] = deepCopy(sv)
			}
		default:
			dst[k] = v
		}
	}
}

func deepCopy(v values) values {
	b, _ := json.Marshal(v)
	var out values
	_ = json.Unmarshal(b, &out)
	return out
}

func get(v values, path ...string) any {
	var cur any = v
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil
		}
		cur = m[p]
	}
	return cur
}

func asString(v any) string {
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	default:
		return fmt.Sprint(x)
	}
}

func asInt(v any, what string) (int64, error) {
	switch x := v.(type) {
	case float64:
		return int64(x), nil
	case string:
		return strconv.ParseInt(x, 10, 64)
	default:
		return 0, fmt.Errorf("%s: not a number: %v", what, v)
	}
}

func prepareScenario(dir, name, namespace string, files []string) error {
	if dir == "" || name == "" || namespace == "" || len(files) == 0 {
		return errors.New("KEDA_CONTRACT_SCENARIO_DIR, _NAME, _NAMESPACE and _VALUES are required")
	}
	merged := values{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		layer := values{}
		if err := yaml.Unmarshal(data, &layer); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		overlay(merged, layer)
	}
	info := scenarioInfo{Name: name, Namespace: namespace, Workers: map[string]workerIntent{}}
	info.ClusterObjectNamespace = asString(get(merged, "keda", "clusterObjectNamespace"))
	if info.ClusterObjectNamespace == "" {
		info.ClusterObjectNamespace = asString(get(merged, "keda", "namespace"))
	}
	prefix := asString(get(merged, "resourceNamePrefix"))
	defaults, _ := get(merged, "workerDefaults").(map[string]any)
	entries, _ := get(merged, "workers").([]any)
	for i, e := range entries {
		entry, ok := e.(map[string]any)
		if !ok {
			return fmt.Errorf("workers[%d] is not a map", i)
		}
		w := deepCopy(defaults)
		if w == nil {
			w = values{}
		}
		mergeEntry(w, entry)
		if get(w, "keda", "enabled") != true {
			continue
		}
		at := fmt.Sprintf("workers[%d]", i)
		var intent workerIntent
		var err error
		if intent.SyncSlots, err = asInt(get(w, "syncSlots"), at+".syncSlots"); err != nil {
			return err
		}
		minR, err := asInt(get(w, "keda", "minReplicaCount"), at+".keda.minReplicaCount")
		if err != nil {
			return err
		}
		maxR, err := asInt(get(w, "keda", "maxReplicaCount"), at+".keda.maxReplicaCount")
		if err != nil {
			return err
		}
		intent.MinReplicas, intent.MaxReplicas = int32(minR), int32(maxR)
		intent.ActivationTargetValue = asString(get(w, "keda", "activationTargetValue"))
		intent.Trigger = asString(get(w, "keda", "trigger"))
		if fb := get(w, "keda", "fallback", "replicas"); fb != nil {
			n, err := asInt(fb, at+".keda.fallback.replicas")
			if err != nil {
				return err
			}
			intent.FallbackReplicas = int32(n)
		} else {
			intent.FallbackReplicas = intent.MinReplicas
		}
		// A fallback of 0 replicas is none: KEDA would take it for activity and wake a pool at zero.
		intent.FallbackEnabled = get(w, "keda", "fallback", "enabled") == true && intent.FallbackReplicas > 0
		info.Workers[prefix+"-worker-"+asString(get(w, "name"))] = intent
	}
	out, _ := json.MarshalIndent(info, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "scenario.json"), out, 0o600); err != nil {
		return err
	}
	return writeProvidedSecrets(dir, namespace)
}

// writeProvidedSecrets creates, with random values, every Secret key the rendered objects
// reference in Secrets they do not render themselves (existingSecret settings).
func writeProvidedSecrets(dir, namespace string) error {
	sc := &scenario{Dir: dir}
	if err := sc.loadObjects(); err != nil {
		return err
	}
	want := map[string][]string{}
	need := func(name, key string) {
		if name != "" && named(sc.Secrets, name) == nil && !slices.Contains(want[name], key) {
			want[name] = append(want[name], key)
		}
	}
	for _, d := range sc.Deployments {
		spec := d.Spec.Template.Spec
		for _, c := range append(spec.InitContainers, spec.Containers...) {
			for _, e := range c.Env {
				if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					need(e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key)
				}
			}
			for _, ef := range c.EnvFrom {
				if ef.SecretRef != nil {
					need(ef.SecretRef.Name, "")
				}
			}
		}
		for _, v := range spec.Volumes {
			if v.Secret != nil {
				for _, it := range v.Secret.Items {
					need(v.Secret.SecretName, it.Key)
				}
			}
		}
	}
	for _, ta := range sc.TriggerAuths {
		for _, r := range ta.Spec.SecretTargetRef {
			need(r.Name, r.Key)
		}
	}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	var docs []string
	for _, n := range names {
		s := corev1.Secret{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
			ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: namespace},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{},
		}
		for _, k := range want[n] {
			if k == "" {
				continue
			}
			buf := make([]byte, 24)
			_, _ = rand.Read(buf)
			s.Data[k] = []byte("provided-" + hex.EncodeToString(buf))
		}
		b, err := yaml.Marshal(&s)
		if err != nil {
			return err
		}
		docs = append(docs, "# provided by the operator before the install\n"+string(b))
	}
	return os.WriteFile(filepath.Join(dir, "provided.yaml"), []byte(strings.Join(docs, "---\n")), 0o600)
}

func writeSentinelPodFiles(dir, out string) error {
	if dir == "" || out == "" {
		return errors.New("KEDA_CONTRACT_SCENARIO_DIR and KEDA_CONTRACT_OUT are required")
	}
	sc, err := loadScenarioFrom(dir)
	if err != nil {
		return err
	}
	pod, err := sentinelOfScenario(sc)
	if err != nil {
		return err
	}
	config, err := yaml.YAMLToJSON(pod.ConfigYAML)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(out, "config.json"), config, 0o600); err != nil {
		return err
	}
	if pod.Config.Auth.StaticTokensFile != "" {
		if len(pod.Tokens) == 0 {
			return fmt.Errorf("the Sentinel's tokens file %s holds no token", pod.Config.Auth.StaticTokensFile)
		}
		if err := os.WriteFile(filepath.Join(out, "tokens"), []byte(strings.Join(pod.Tokens, "\n")+"\n"), 0o600); err != nil {
			return err
		}
	}
	info, _ := json.MarshalIndent(map[string]any{
		"deployment": pod.Deployment.Name, "containerPort": pod.Port, "configPath": pod.ConfigPath,
	}, "", "  ")
	return os.WriteFile(filepath.Join(out, "pod.json"), info, 0o600)
}
