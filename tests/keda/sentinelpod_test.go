package kedacontract

import (
	"fmt"
	"net/url"
	"path"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// sentinelConfig is the part of the Sentinel's config file these tests read.
type sentinelConfig struct {
	RefreshInterval string `json:"refreshInterval"`
	StalenessLimit  string `json:"stalenessLimit"`
	Auth            struct {
		Disabled         bool                 `json:"disabled"`
		StaticTokensFile string               `json:"staticTokensFile"`
		TokenReview      *sentinelTokenReview `json:"tokenReview"`
	} `json:"auth"`
	Workers []sentinelWorker `json:"workers"`
}

type sentinelTokenReview struct {
	AllowedUsernames []string `json:"allowedUsernames"`
	Audiences        []string `json:"audiences"`
}

// audiencesOrAPIServer: the audiences a token must carry to pass the Sentinel's review (the
// API server's own when the review names none).
func (r *sentinelTokenReview) audiencesOrAPIServer() []string {
	if len(r.Audiences) == 0 {
		return []string{apiServerAudience}
	}
	return r.Audiences
}

type sentinelWorker struct {
	Name        string   `json:"name"`
	Queues      []string `json:"queues"`
	SyncSlots   int64    `json:"syncSlots"`
	MinReplicas int32    `json:"minReplicas"`
	MaxReplicas int32    `json:"maxReplicas"`
	// Headroom (keda.overprovisionSlots); absent: 0.
	OverprovisionSlots int64 `json:"overprovisionSlots"`
}

// sentinelPod is what the Pod behind a trigger URL sees, worked out from the rendered objects
// the way Kubernetes would: URL host → Service → selected Deployment → container port, and the
// files its volumes put at the paths its config names.
type sentinelPod struct {
	Service    *corev1.Service
	Deployment *appsv1.Deployment
	Container  corev1.Container
	Port       int32 // the container port the URL reaches
	ConfigPath string
	ConfigYAML []byte
	Config     sentinelConfig
	Tokens     []string // static mode: the tokens file as mounted
}

// env is the value the container's environment gives `name` ("" when it is not set).
func (p *sentinelPod) env(name string) string {
	for _, e := range p.Container.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func (p *sentinelPod) worker(name string) *sentinelWorker {
	for i := range p.Config.Workers {
		if p.Config.Workers[i].Name == name {
			return &p.Config.Workers[i]
		}
	}
	return nil
}

// sentinelBehind resolves the Pod that serves a rendered trigger URL.
func sentinelBehind(sc *scenario, rawURL string) (*sentinelPod, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	host := u.Hostname()
	labelsOfHost := strings.Split(host, ".")
	// <service>.<namespace>.svc.<cluster domain>
	if len(labelsOfHost) < 4 || labelsOfHost[2] != "svc" {
		return nil, fmt.Errorf("url %s: host %q is not <service>.<namespace>.svc.<cluster domain>", rawURL, host)
	}
	if labelsOfHost[1] != sc.Info.Namespace {
		return nil, fmt.Errorf("url %s: namespace %q, but the release is in %q", rawURL, labelsOfHost[1], sc.Info.Namespace)
	}
	svc := named(sc.Services, labelsOfHost[0])
	if svc == nil {
		return nil, fmt.Errorf("url %s: no rendered Service %q", rawURL, labelsOfHost[0])
	}
	portNum := 80
	if u.Scheme == "https" {
		portNum = 443
	}
	if p := u.Port(); p != "" {
		portNum, err = strconv.Atoi(p)
		if err != nil {
			return nil, err
		}
	}
	var target *intstr.IntOrString
	for i := range svc.Spec.Ports {
		if int(svc.Spec.Ports[i].Port) == portNum {
			target = &svc.Spec.Ports[i].TargetPort
		}
	}
	if target == nil {
		return nil, fmt.Errorf("url %s: Service %s has no port %d", rawURL, svc.Name, portNum)
	}
	selector := labels.SelectorFromSet(svc.Spec.Selector)
	var pods []*appsv1.Deployment
	for _, d := range sc.Deployments {
		if len(svc.Spec.Selector) > 0 && selector.Matches(labels.Set(d.Spec.Template.Labels)) {
			pods = append(pods, d)
		}
	}
	if len(pods) != 1 {
		return nil, fmt.Errorf("url %s: Service %s selects %d Deployments, want 1", rawURL, svc.Name, len(pods))
	}
	p := &sentinelPod{Service: svc, Deployment: pods[0]}
	found := false
	for _, c := range p.Deployment.Spec.Template.Spec.Containers {
		for _, cp := range c.Ports {
			if (target.Type == intstr.String && cp.Name == target.StrVal) ||
				(target.Type == intstr.Int && cp.ContainerPort == target.IntVal) {
				p.Container, p.Port, found = c, cp.ContainerPort, true
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("url %s: no container of Deployment %s has the Service's target port %s",
			rawURL, p.Deployment.Name, target.String())
	}
	for i, a := range p.Container.Args {
		if v, ok := strings.CutPrefix(a, "--config="); ok {
			p.ConfigPath = v
		} else if a == "--config" && i+1 < len(p.Container.Args) {
			p.ConfigPath = p.Container.Args[i+1]
		}
	}
	// The port must be one the Sentinel listens on: its HTTP API's or its external scaler's.
	var listens []string
	reached := false
	for _, e := range p.Container.Env {
		if e.Name == "ASTRO_SENTINEL_CONFIG" && p.ConfigPath == "" {
			p.ConfigPath = e.Value
		}
		if e.Name == "ASTRO_SENTINEL_LISTEN" || e.Name == "ASTRO_SENTINEL_EXTERNAL_SCALER_LISTEN" {
			listens = append(listens, e.Value)
			if _, port, err := splitHostPort(e.Value); err == nil && port == p.Port {
				reached = true
			}
		}
	}
	if len(listens) > 0 && !reached {
		return nil, fmt.Errorf("the Sentinel listens on %v but the Service reaches port %d", listens, p.Port)
	}
	if p.ConfigPath == "" {
		return nil, fmt.Errorf("container %s of %s has no --config", p.Container.Name, p.Deployment.Name)
	}
	if p.ConfigYAML, err = fileInContainer(sc, p.Deployment, p.Container, p.ConfigPath); err != nil {
		return nil, fmt.Errorf("the Sentinel's config file: %w", err)
	}
	if err := yaml.Unmarshal(p.ConfigYAML, &p.Config); err != nil {
		return nil, fmt.Errorf("the Sentinel's config file %s: %w", p.ConfigPath, err)
	}
	if f := p.Config.Auth.StaticTokensFile; f != "" {
		data, err := fileInContainer(sc, p.Deployment, p.Container, f)
		if err != nil {
			return nil, fmt.Errorf("the Sentinel's static tokens file: %w", err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			line = strings.TrimSpace(line)
			if line != "" && !strings.HasPrefix(line, "#") {
				p.Tokens = append(p.Tokens, line)
			}
		}
	}
	return p, nil
}

func splitHostPort(addr string) (string, int32, error) {
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		return "", 0, fmt.Errorf("no port in %q", addr)
	}
	n, err := strconv.Atoi(addr[i+1:])
	return addr[:i], int32(n), err
}

// fileInContainer returns the content a ConfigMap or Secret volume puts at an absolute path.
func fileInContainer(sc *scenario, d *appsv1.Deployment, c corev1.Container, file string) ([]byte, error) {
	var mount *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		if file == m.MountPath || strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") {
			if mount == nil || len(m.MountPath) > len(mount.MountPath) {
				mount = &c.VolumeMounts[i]
			}
		}
	}
	if mount == nil {
		return nil, fmt.Errorf("%s: no volume is mounted there", file)
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(file, mount.MountPath), "/")
	if mount.SubPath != "" {
		if file != mount.MountPath {
			return nil, fmt.Errorf("%s: inside a subPath mount", file)
		}
		rel = mount.SubPath
	}
	rel = path.Clean(rel)
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name != mount.Name {
			continue
		}
		switch {
		case v.ConfigMap != nil:
			cm := named(sc.ConfigMaps, v.ConfigMap.Name)
			if cm == nil {
				return nil, fmt.Errorf("%s: ConfigMap %s is neither rendered nor provided", file, v.ConfigMap.Name)
			}
			key, err := keyForPath(v.ConfigMap.Items, rel)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", file, err)
			}
			if s, ok := cm.Data[key]; ok {
				return []byte(s), nil
			}
			return nil, fmt.Errorf("%s: ConfigMap %s has no key %q", file, cm.Name, key)
		case v.Secret != nil:
			s := named(sc.Secrets, v.Secret.SecretName)
			if s == nil {
				return nil, fmt.Errorf("%s: Secret %s is neither rendered nor provided", file, v.Secret.SecretName)
			}
			key, err := keyForPath(v.Secret.Items, rel)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", file, err)
			}
			if b, ok := s.Data[key]; ok {
				return b, nil
			}
			return nil, fmt.Errorf("%s: Secret %s has no key %q", file, s.Name, key)
		default:
			return nil, fmt.Errorf("%s: volume %s is neither a ConfigMap nor a Secret", file, v.Name)
		}
	}
	return nil, fmt.Errorf("%s: the Pod has no volume %q", file, mount.Name)
}

func keyForPath(items []corev1.KeyToPath, rel string) (string, error) {
	if len(items) == 0 {
		return rel, nil
	}
	for _, it := range items {
		if path.Clean(it.Path) == rel {
			return it.Key, nil
		}
	}
	return "", fmt.Errorf("no item of the volume is projected to %q", rel)
}

// sentinelOf finds the one Sentinel every backlog trigger of the scenario calls.
func sentinelOf(t *testing.T, sc *scenario) *sentinelPod {
	t.Helper()
	pod, err := sentinelOfScenario(sc)
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

func sentinelOfScenario(sc *scenario) (*sentinelPod, error) {
	var pod *sentinelPod
	for _, so := range sc.ScaledObjects {
		for _, bt := range backlogTriggers(so) {
			p, err := sentinelBehind(sc, bt.Trigger.Metadata["url"])
			if err != nil {
				return nil, fmt.Errorf("ScaledObject %s: %w", so.Name, err)
			}
			if pod != nil && p.Deployment.Name != pod.Deployment.Name {
				return nil, fmt.Errorf("triggers call two Sentinels: %s and %s", pod.Deployment.Name, p.Deployment.Name)
			}
			pod = p
		}
	}
	if pod == nil {
		return nil, fmt.Errorf("no ScaledObject has a %s trigger", metricsAPIType)
	}
	return pod, nil
}
