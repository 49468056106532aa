// Package check checks deploy/kubernetes/ offline: every manifest decodes strictly (an
// unknown or misplaced field is an error) into the Kubernetes API's own types (Prometheus
// Operator's for the ServiceMonitor, Strimzi's fields for its resources), each region's
// ConfigMap passes `geostate check-config` with the StatefulSet's own arguments, and the
// containers' ports, probes, paths and image agree with the binary and the Containerfile.
//
//	GEOSTATE_BIN=target/debug/geostate go test ./...   (cargo test --test deploy runs it)
package check

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// The regions of the three-region deployment, one folder each.
var regions = []string{"us-east-1", "eu-west-1", "ap-southeast-1"}

// Kafka's transaction timeout of a node's shipping producer (src/keeper.rs,
// SHIP_TRANSACTION_TIMEOUT): a stopping node's last transaction must end within it.
const shipTransactionTimeoutSeconds = 30

// What a SIGTERMed node needs besides: handing its partitions and leases off.
const drainSeconds = 15

// Every document of one folder, decoded.
type manifests struct {
	namespaces      []corev1.Namespace
	configMaps      []corev1.ConfigMap
	services        []corev1.Service
	statefulSets    []appsv1.StatefulSet
	budgets         []policyv1.PodDisruptionBudget
	serviceMonitors []monitoringv1.ServiceMonitor
	topics          []KafkaTopic
	mirrorMakers    []KafkaMirrorMaker2
}

func root() string {
	dir, err := filepath.Abs("..")
	if err != nil {
		panic(err)
	}
	return dir
}

// documents splits a YAML stream at its `---` lines, leaving out empty documents.
func documents(data []byte) [][]byte {
	var out [][]byte
	for _, doc := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(string(data), -1) {
		if strings.TrimSpace(stripComments(doc)) != "" {
			out = append(out, []byte(doc))
		}
	}
	return out
}

func stripComments(doc string) string {
	var kept []string
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			kept = append(kept, line)
		}
	}
	return strings.Join(kept, "\n")
}

// decodeInto decodes one document strictly (unknown fields and duplicate keys are errors)
// and appends it to `into`.
func decodeInto[T any](doc []byte, into *[]T) error {
	var o T
	err := yaml.UnmarshalStrict(doc, &o)
	*into = append(*into, o)
	return err
}

func load(t *testing.T, dir string) manifests {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s (%v)", dir, err)
	}
	var m manifests
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range documents(data) {
			if err := m.add(doc); err != nil {
				t.Errorf("%s, document %d: %v", file, i+1, err)
			}
		}
	}
	return m
}

func (m *manifests) add(doc []byte) error {
	var meta metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return err
	}
	switch meta.APIVersion + " " + meta.Kind {
	case "v1 Namespace":
		return decodeInto(doc, &m.namespaces)
	case "v1 ConfigMap":
		return decodeInto(doc, &m.configMaps)
	case "v1 Service":
		return decodeInto(doc, &m.services)
	case "apps/v1 StatefulSet":
		return decodeInto(doc, &m.statefulSets)
	case "policy/v1 PodDisruptionBudget":
		return decodeInto(doc, &m.budgets)
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return decodeInto(doc, &m.serviceMonitors)
	case "kafka.strimzi.io/v1beta2 KafkaTopic":
		return decodeInto(doc, &m.topics)
	case "kafka.strimzi.io/v1beta2 KafkaMirrorMaker2":
		return decodeInto(doc, &m.mirrorMakers)
	}
	return fmt.Errorf("%s %s: not a kind these manifests use", meta.APIVersion, meta.Kind)
}

func TestEveryManifestDecodesStrictly(t *testing.T) {
	dirs := append([]string{"witness"}, regions...)
	for _, dir := range dirs {
		load(t, filepath.Join(root(), dir))
	}
	// the check itself: a misspelt field fails
	bad := []byte("apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: x}\nspec: {replica: 3}\n")
	if err := (&manifests{}).add(bad); err == nil {
		t.Fatal("a StatefulSet with `replica` decoded without error")
	}
	bad = []byte("apiVersion: kafka.strimzi.io/v1beta2\nkind: KafkaTopic\nmetadata: {name: x}\nspec: {partitions: 1, replicas: 1, partiton: 2}\n")
	if err := (&manifests{}).add(bad); err == nil {
		t.Fatal("a KafkaTopic with `partiton` decoded without error")
	}
}

// The region folders differ only in their region's name, but for the ConfigMap (checked
// by check-config below) and MirrorMaker 2 (each mirrors the others into itself).
func TestTheRegionsDifferOnlyInTheirNames(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join(root(), regions[0], "*.yaml"))
	for _, file := range files {
		name := filepath.Base(file)
		if name == "configmap.yaml" || name == "mirrormaker2.yaml" {
			continue
		}
		want := readText(t, file)
		for _, region := range regions[1:] {
			got := readText(t, filepath.Join(root(), region, name))
			if strings.ReplaceAll(got, region, regions[0]) != want {
				t.Errorf("%s/%s is not %s/%s with the region's name", region, name, regions[0], name)
			}
		}
	}
	for _, region := range regions {
		m := load(t, filepath.Join(root(), region))
		if len(m.mirrorMakers) != 1 {
			t.Fatalf("%s: %d KafkaMirrorMaker2, want 1", region, len(m.mirrorMakers))
		}
		mm := m.mirrorMakers[0].Spec
		if mm.ConnectCluster != region {
			t.Errorf("%s: MirrorMaker 2 runs on %s", region, mm.ConnectCluster)
		}
		aliases := map[string]bool{}
		for _, c := range mm.Clusters {
			aliases[c.Alias] = true
		}
		var sources []string
		for _, mirror := range mm.Mirrors {
			if mirror.TargetCluster != region || !aliases[mirror.SourceCluster] {
				t.Errorf("%s: a mirror %s -> %s", region, mirror.SourceCluster, mirror.TargetCluster)
			}
			if !regexp.MustCompile("^(" + mirror.TopicsPattern + ")$").MatchString("geostate.deltas") {
				t.Errorf("%s: mirror from %s does not take geostate.deltas", region, mirror.SourceCluster)
			}
			c := mirror.SourceConnector
			if c == nil || c.Config["consumer.isolation.level"] != "read_committed" {
				t.Errorf("%s: mirror from %s reads aborted transactions", region, mirror.SourceCluster)
			}
			sources = append(sources, mirror.SourceCluster)
		}
		if fmt.Sprint(sorted(sources)) != fmt.Sprint(others(region)) {
			t.Errorf("%s: mirrors from %v, want %v", region, sources, others(region))
		}
		topics := map[string]KafkaTopic{}
		for _, topic := range m.topics {
			topics[topic.Name] = topic
		}
		deltas, ok := topics["geostate.deltas"]
		if !ok || deltas.Spec.Config["cleanup.policy"] != "compact" {
			t.Errorf("%s: geostate.deltas missing or not compacted", region)
		}
		if topics["geostate.updates"].Spec.Partitions != deltas.Spec.Partitions {
			t.Errorf("%s: updates and deltas have different partition counts", region)
		}
	}
}

// Each region's ConfigMap, run with its StatefulSet's arguments (the pod's variables
// given, ordinal 0 and a learner), passes `geostate check-config`; what it would run
// agrees with the pod (ports, volume), the other regions (the lease group, the
// namespaces) and the other manifests.
func TestEachRegionsConfigPassesCheckConfigWithThePodsArguments(t *testing.T) {
	groups := map[string]string{}
	namespaces := map[string]string{}
	for _, region := range regions {
		m := load(t, filepath.Join(root(), region))
		set := onlyStatefulSet(t, m, region)
		pod := set.Spec.Template.Spec
		c := pod.Containers[0]
		if set.Namespace != region || len(m.namespaces) != 1 || m.namespaces[0].Name != region {
			t.Errorf("%s: the namespace must be the region's name", region)
		}
		for _, ordinal := range []int{0, 2} {
			described := checkConfig(t, region, m, c, ordinal)
			lines := strings.Split(described, "\n")
			if !strings.Contains(described, "\nregion "+region+"\n") {
				t.Errorf("%s: check-config says\n%s", region, described)
			}
			data := mountOf(t, c, "data")
			if !strings.Contains(described, "\ndata dir "+data+"/") {
				t.Errorf("%s: the data dir is not on the volume at %s:\n%s", region, data, described)
			}
			ports := containerPorts(c)
			want := fmt.Sprintf("api gRPC 0.0.0.0:%d (TLS, advertised as geostate-%d.geostate.%s.svc.cluster.local:%d), metrics 0.0.0.0:%d (TLS)",
				ports["grpc"], ordinal, region, ports["grpc"], ports["metrics"])
			if !contains(lines, want) {
				t.Errorf("%s: want %q in\n%s", region, want, described)
			}
			learner := "member"
			if ordinal > 0 {
				learner = fmt.Sprintf("learner %d under member", ordinal)
			}
			lease := fmt.Sprintf("lease group: %s", learner)
			listen := fmt.Sprintf("listening on 10.0.0.%d:%d (TLS)", ordinal+10, ports["lease"])
			if !anyWith(lines, lease, listen) {
				t.Errorf("%s ordinal %d: want %q and %q in\n%s", region, ordinal, lease, listen, described)
			}
			member := fmt.Sprintf(" %s at geostate-0.%s.%s.svc.cluster.local:%d", region, set.Spec.ServiceName, region, ports["lease"])
			if !anyWith(lines, "  member ", member) {
				t.Errorf("%s: its member's address is not its pod 0's lease port (%q)", region, member)
			}
			for _, other := range others(region) {
				if !contains(lines, fmt.Sprintf("merges %s from %s.geostate.deltas on this region's Kafka", other, other)) {
					t.Errorf("%s: does not merge %s", region, other)
				}
			}
			groups[region] = matching(lines, "  member ")
			namespaces[region] = matching(lines, "namespace ")
		}
	}
	for _, region := range regions[1:] {
		if groups[region] != groups[regions[0]] {
			t.Errorf("the lease groups of %s and %s differ:\n%s\n%s", region, regions[0], groups[region], groups[regions[0]])
		}
		if namespaces[region] != namespaces[regions[0]] {
			t.Errorf("the namespaces of %s and %s differ", region, regions[0])
		}
	}
	if strings.Count(groups[regions[0]], "\n") != len(regions) {
		t.Errorf("a lease group of three regions has three members (no witness):\n%s", groups[regions[0]])
	}
	// and the check itself: a setting the node refuses fails it
	m := load(t, filepath.Join(root(), regions[0]))
	broken := m.configMaps[0].DeepCopy()
	broken.Data["geostate.toml"] = strings.Replace(broken.Data["geostate.toml"], "member-id = 3", "member-id = 7", 1)
	m.configMaps[0] = *broken
	if _, err := runCheckConfig(t, regions[0], m, onlyStatefulSet(t, m, regions[0]).Spec.Template.Spec.Containers[0], 0); err == nil {
		t.Fatal("check-config took member-id 7")
	}
}

func TestTheWitnessConfigPassesCheckConfig(t *testing.T) {
	m := load(t, filepath.Join(root(), "witness"))
	set := onlyStatefulSet(t, m, "witness")
	c := set.Spec.Template.Spec.Containers[0]
	described, err := runCheckConfig(t, "witness", m, c, 0)
	if err != nil {
		t.Fatal(err)
	}
	ports := containerPorts(c)
	if !strings.Contains(described, fmt.Sprintf("listening on 0.0.0.0:%d (TLS)", ports["lease"])) {
		t.Errorf("the witness does not listen on its container's lease port:\n%s", described)
	}
	if *set.Spec.Replicas != 1 {
		t.Errorf("one witness, not %d", *set.Spec.Replicas)
	}
}

// The containers run the image's binary with flags it takes; probes ask the ports the
// config serves; the Services, budget and monitor select the pods; the grace period
// outlasts a shipping transaction and a drain.
func TestPodsServicesAndProbesMatchTheBinary(t *testing.T) {
	containerfile := readText(t, filepath.Join(root(), "..", "Containerfile"))
	entrypoint := regexp.MustCompile(`(?m)^ENTRYPOINT \["([^"]+)"\]`).FindStringSubmatch(containerfile)
	if entrypoint == nil || !strings.Contains(containerfile, "/usr/local/bin/"+entrypoint[1]) {
		t.Fatal("the Containerfile's ENTRYPOINT is not its binary on the PATH")
	}
	exposed := map[int32]bool{}
	for _, line := range regexp.MustCompile(`(?m)^EXPOSE (.+)$`).FindAllStringSubmatch(containerfile, -1) {
		for _, port := range strings.Fields(line[1]) {
			n, _ := strconv.Atoi(port)
			exposed[int32(n)] = true
		}
	}
	for _, dir := range append([]string{"witness"}, regions...) {
		m := load(t, filepath.Join(root(), dir))
		set := onlyStatefulSet(t, m, dir)
		pod := set.Spec.Template.Spec
		c := pod.Containers[0]
		if len(c.Command) != 1 || c.Command[0] != entrypoint[1] {
			t.Errorf("%s: command %v, not the image's %s", dir, c.Command, entrypoint[1])
		}
		for _, p := range c.Ports {
			if !exposed[p.ContainerPort] {
				t.Errorf("%s: port %d is not EXPOSEd by the Containerfile", dir, p.ContainerPort)
			}
		}
		grace := *pod.TerminationGracePeriodSeconds
		if dir != "witness" && grace < shipTransactionTimeoutSeconds+drainSeconds {
			t.Errorf("%s: a grace period of %d s, less than the shipping transaction timeout and a drain", dir, grace)
		}
		selector := labels.SelectorFromSet(set.Spec.Selector.MatchLabels)
		if !selector.Matches(labels.Set(set.Spec.Template.Labels)) {
			t.Errorf("%s: the StatefulSet's selector does not select its pods", dir)
		}
		ports := containerPorts(c)
		headless := false
		for _, s := range m.services {
			if !labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(set.Spec.Template.Labels)) {
				t.Errorf("%s: Service %s selects no pod of the StatefulSet", dir, s.Name)
			}
			for _, p := range s.Spec.Ports {
				if _, ok := ports[p.TargetPort.String()]; !ok {
					t.Errorf("%s: Service %s targets port %s, which the container does not name", dir, s.Name, p.TargetPort.String())
				}
			}
			headless = headless || (s.Name == set.Spec.ServiceName && s.Spec.ClusterIP == corev1.ClusterIPNone)
		}
		if !headless {
			t.Errorf("%s: no headless Service %s", dir, set.Spec.ServiceName)
		}
		for _, b := range m.budgets {
			selector, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
			if err != nil || !selector.Matches(labels.Set(set.Spec.Template.Labels)) {
				t.Errorf("%s: the PodDisruptionBudget selects no pod", dir)
			}
		}
		for _, sm := range m.serviceMonitors {
			selector, _ := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
			for _, e := range sm.Spec.Endpoints {
				found := false
				for _, s := range m.services {
					for _, p := range s.Spec.Ports {
						found = found || (selector.Matches(labels.Set(s.Labels)) && p.Name == e.Port && p.TargetPort.String() == "metrics")
					}
				}
				if !found {
					t.Errorf("%s: the ServiceMonitor's port %q is no selected Service's metrics port", dir, e.Port)
				}
			}
		}
		if dir == "witness" {
			continue
		}
		if len(m.budgets) != 1 || len(m.serviceMonitors) != 1 {
			t.Errorf("%s: a region has one PodDisruptionBudget and one ServiceMonitor", dir)
		}
		// the target labels deploy/prometheus/rules.yml and deploy/grafana select on
		for _, sm := range m.serviceMonitors {
			set := map[string]string{}
			for _, e := range sm.Spec.Endpoints {
				for _, r := range e.RelabelConfigs {
					value := ""
					if r.Replacement != nil {
						value = *r.Replacement
					}
					if len(r.SourceLabels) > 0 {
						value = string(r.SourceLabels[0])
					}
					set[r.TargetLabel] = value
				}
			}
			want := map[string]string{"job": "geostate", "geostate_region": dir, "node": "__meta_kubernetes_pod_name"}
			for label, value := range want {
				if set[label] != value {
					t.Errorf("%s: the ServiceMonitor sets %s to %q, not %q (the alerting rules select on it)", dir, label, set[label], value)
				}
			}
			if _, ok := set["region"]; ok {
				t.Errorf("%s: the ServiceMonitor sets `region`, which renames the metrics' own region label", dir)
			}
		}
		if set.Spec.Template.Annotations["prometheus.io/port"] != strconv.Itoa(int(ports["metrics"])) {
			t.Errorf("%s: the scrape annotation names another port than metrics", dir)
		}
		probes := map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe}
		for name, probe := range probes {
			if probe == nil || probe.Exec == nil {
				t.Errorf("%s: no %s exec probe", dir, name)
				continue
			}
			command := probe.Exec.Command
			if command[0] != entrypoint[1] || command[1] != "probe" {
				t.Errorf("%s: the %s probe runs %v, not `geostate probe`", dir, name, command)
				continue
			}
			if (name == "readiness") != contains(command, "--ready") {
				t.Errorf("%s: only the readiness probe asks --ready", dir)
			}
			addr := flag(command, "--addr")
			if addr != fmt.Sprintf("https://127.0.0.1:%d", ports["grpc"]) {
				t.Errorf("%s: the %s probe asks %s, not the gRPC port over TLS", dir, name, addr)
			}
			for _, file := range []string{flag(command, "--ca"), flag(command, "--token-file")} {
				if file != "" && !underAMount(c, file) {
					t.Errorf("%s: the %s probe reads %s, on no volume", dir, name, file)
				}
			}
			// the binary takes these flags: it fails to connect (1), not to parse (2)
			out, code := run(t, nil, command[1:]...)
			if code != 1 || strings.Contains(out, "Usage:") {
				t.Errorf("%s: `geostate %s` exited %d:\n%s", dir, strings.Join(command[1:], " "), code, out)
			}
		}
		// every file the config names is on a mounted volume
		config := m.configMaps[0].Data["geostate.toml"]
		for _, path := range regexp.MustCompile(`"(/etc/geostate/[^"]+)"`).FindAllStringSubmatch(config, -1) {
			if !underAMount(c, path[1]) {
				t.Errorf("%s: the config names %s, on no volume of the pod", dir, path[1])
			}
		}
	}
}

func onlyStatefulSet(t *testing.T, m manifests, dir string) appsv1.StatefulSet {
	t.Helper()
	if len(m.statefulSets) != 1 || len(m.statefulSets[0].Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("%s: one StatefulSet of one container expected", dir)
	}
	return m.statefulSets[0]
}

// checkConfig runs `geostate check-config` as the pod of `ordinal` would run `geostate run`.
func checkConfig(t *testing.T, dir string, m manifests, c corev1.Container, ordinal int) string {
	t.Helper()
	out, err := runCheckConfig(t, dir, m, c, ordinal)
	if err != nil {
		t.Fatalf("%s ordinal %d: %v", dir, ordinal, err)
	}
	return out
}

func runCheckConfig(t *testing.T, dir string, m manifests, c corev1.Container, ordinal int) (string, error) {
	t.Helper()
	if len(c.Args) == 0 || c.Args[0] != "run" {
		t.Fatalf("%s: the container's arguments %v do not start with `run`", dir, c.Args)
	}
	// the ConfigMap's files where the pod mounts them, under a temporary root
	tmp := t.TempDir()
	args := []string{"check-config"}
	for _, arg := range c.Args[1:] {
		args = append(args, expand(arg, dir, ordinal))
	}
	for _, v := range c.VolumeMounts {
		for _, vol := range m.statefulSets[0].Spec.Template.Spec.Volumes {
			if vol.Name != v.Name || vol.ConfigMap == nil {
				continue
			}
			for _, cm := range m.configMaps {
				if cm.Name != vol.ConfigMap.Name {
					continue
				}
				for key, text := range cm.Data {
					path := filepath.Join(tmp, v.MountPath, key)
					if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
						t.Fatal(err)
					}
					for i, arg := range args {
						if arg == filepath.Join(v.MountPath, key) {
							args[i] = path
						}
					}
				}
			}
		}
	}
	// the Secrets' variables, as the pod gets them
	env := []string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			env = append(env, e.Name+"=from-a-secret")
		}
	}
	out, code := run(t, env, args...)
	if code != 0 {
		return "", errors.New(out)
	}
	return "\n" + out, nil
}

// expand gives a container argument the values Kubernetes would: $(VAR) of the pod's
// fields for the pod of `ordinal`.
func expand(arg, namespace string, ordinal int) string {
	name := "geostate"
	if namespace == "witness" {
		name = "witness"
	}
	return strings.NewReplacer(
		"$(POD_NAME)", fmt.Sprintf("%s-%d", name, ordinal),
		"$(POD_INDEX)", strconv.Itoa(ordinal),
		"$(POD_IP)", fmt.Sprintf("10.0.0.%d", ordinal+10),
	).Replace(arg)
}

func run(t *testing.T, env []string, args ...string) (string, int) {
	t.Helper()
	bin := os.Getenv("GEOSTATE_BIN")
	if bin == "" {
		t.Fatal("GEOSTATE_BIN: the geostate binary to check against (cargo test --test deploy sets it)")
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return out.String(), exit.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), 0
}

func containerPorts(c corev1.Container) map[string]int32 {
	out := map[string]int32{}
	for _, p := range c.Ports {
		out[p.Name] = p.ContainerPort
	}
	return out
}

func mountOf(t *testing.T, c corev1.Container, volume string) string {
	t.Helper()
	for _, v := range c.VolumeMounts {
		if v.Name == volume {
			return v.MountPath
		}
	}
	t.Fatalf("no volume %s mounted", volume)
	return ""
}

func underAMount(c corev1.Container, path string) bool {
	for _, v := range c.VolumeMounts {
		if strings.HasPrefix(path, strings.TrimSuffix(v.MountPath, "/")+"/") {
			return true
		}
	}
	return false
}

func flag(command []string, name string) string {
	for i, arg := range command {
		if arg == name && i+1 < len(command) {
			return command[i+1]
		}
	}
	return ""
}

func others(region string) []string {
	var out []string
	for _, r := range regions {
		if r != region {
			out = append(out, r)
		}
	}
	return sorted(out)
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	return out
}

func contains(lines []string, want string) bool {
	for _, l := range lines {
		if l == want {
			return true
		}
	}
	return false
}

func anyWith(lines []string, parts ...string) bool {
	for _, l := range lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			return true
		}
	}
	return false
}

func matching(lines []string, prefix string) string {
	var out strings.Builder
	for _, l := range lines {
		if strings.HasPrefix(l, prefix) {
			out.WriteString(l + "\n")
		}
	}
	return out.String()
}

func readText(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
