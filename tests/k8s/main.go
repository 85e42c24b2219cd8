// k8s-manifests: the offline check of deploy/k8s (issue 51). It builds a
// kustomization with kustomize's Go API (no kubectl, no cluster), decodes
// every object strictly (an unknown or duplicate field is an error) into the
// Kubernetes API types, and checks what docs/kubernetes.md promises:
//
//   - the objects: one StatefulSet, its headless peer Service, a client
//     Service, a PodDisruptionBudget and the peer-token Secret, nothing else;
//   - StatefulSet: replicas = TIERKV_K8S_INITIAL_SIZE, Parallel pod
//     management, RollingUpdate with maxUnavailable 1, a PVC per pod mounted
//     at the entrypoint's volume, the selector matching the pod labels;
//   - the container runs tierkv-k8s-entrypoint, with a preStop hook that runs
//     its prestop, and the env it reads naming the real objects (the
//     StatefulSet, the peer Service, the client Service and its port, the pod
//     name from the downward API);
//   - probes: readiness GET /readyz, liveness (and startup) GET /healthz, on
//     the container port that is the entrypoint's HTTP port; both routes are
//     in the gateway's route table (gateway/gateway_internal.h);
//   - Services: the peer one headless, publishing not-ready addresses, with
//     the Raft and HTTP ports; both select the StatefulSet's pods;
//   - the PDB: maxUnavailable 1, selecting exactly the StatefulSet's pods;
//   - required pod anti-affinity per host, selecting the pods;
//   - securityContext: non-root uid, fsGroup, read-only root filesystem, no
//     privilege escalation, every capability dropped; the paths the
//     entrypoint writes (volume, run dir, /tmp) are writable mounts;
//   - resources: memory request = limit, the budget's env taken from the
//     limit (downward API, in MiB), at least 256 MiB; a CPU request;
//   - the Secret: the peer-token key the entrypoint reads, mounted at the
//     entrypoint's secret dir; the optional TLS Secret is optional.
//
// The entrypoint's defaults (ports, paths) are read from the script itself.
//
//	usage: k8s-manifests SOURCE_DIR [KUSTOMIZATION_DIR]   (default deploy/k8s)
package main

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

const entrypointPath = "/usr/local/bin/tierkv-k8s-entrypoint"

var problems []string

func fail(format string, a ...any) { problems = append(problems, fmt.Sprintf(format, a...)) }

func main() {
	if len(os.Args) < 2 || len(os.Args) > 3 {
		fmt.Fprintln(os.Stderr, "usage: k8s-manifests SOURCE_DIR [KUSTOMIZATION_DIR]")
		os.Exit(2)
	}
	src := os.Args[1]
	dir := "deploy/k8s"
	if len(os.Args) == 3 {
		dir = os.Args[2]
	}
	out, err := build(src, dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "k8s-manifests: kustomize build %s: %v\n", dir, err)
		os.Exit(1)
	}
	ep, err := os.ReadFile(filepath.Join(src, "deploy/k8s/tierkv-k8s-entrypoint"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "k8s-manifests: %v\n", err)
		os.Exit(1)
	}
	routes, err := os.ReadFile(filepath.Join(src, "gateway/gateway_internal.h"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "k8s-manifests: %v\n", err)
		os.Exit(1)
	}
	n := check(out, string(ep), string(routes))
	if len(problems) > 0 {
		for _, p := range problems {
			fmt.Printf("FAIL: %s\n", p)
		}
		fmt.Printf("k8s-manifests: %s: %d problem(s)\n", dir, len(problems))
		os.Exit(1)
	}
	fmt.Printf("k8s-manifests: %s: %d objects, every check passed\n", dir, n)
}

// build runs kustomize on SRC/DIR in memory: deploy/k8s and tests/k8s are
// copied into an in-memory file system, with a stand-in peer-token (the real
// one is never in the tree) when there is none.
func build(src, dir string) ([]byte, error) {
	mem := filesys.MakeFsInMemory()
	for _, sub := range []string{"deploy/k8s", "tests/k8s/fixtures"} {
		root := filepath.Join(src, sub)
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(src, p)
			if d.IsDir() {
				return mem.MkdirAll(filepath.Join("/src", rel))
			}
			if !strings.HasSuffix(p, ".yaml") {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return mem.WriteFile(filepath.Join("/src", rel), b)
		})
		if err != nil && !(os.IsNotExist(err) && sub != "deploy/k8s") {
			return nil, err
		}
	}
	if err := mem.WriteFile("/src/deploy/k8s/peer-token", []byte("0123456789abcdef0123456789abcdef\n")); err != nil {
		return nil, err
	}
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(mem, filepath.Join("/src", dir))
	if err != nil {
		return nil, err
	}
	return rm.AsYaml()
}

type kindOnly struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Metadata   metav1.ObjectMeta `json:"metadata"`
}

// decode: strictly into T (unknown and duplicate fields are errors).
func decode[T any](doc []byte, what string) *T {
	var v T
	if err := yaml.UnmarshalStrict(doc, &v); err != nil {
		fail("%s: strict decoding: %v", what, err)
		return nil
	}
	return &v
}

// entrypointDefaults: NAME -> default of every ${TIERKV_K8S_NAME:-default}.
func entrypointDefaults(ep string) map[string]string {
	m := map[string]string{}
	re := regexp.MustCompile(`\$\{(TIERKV_K8S_[A-Z_]+):-([^}]*)\}`)
	for _, g := range re.FindAllStringSubmatch(ep, -1) {
		if _, ok := m[g[1]]; !ok {
			m[g[1]] = g[2]
		}
	}
	return m
}

func check(out []byte, ep, routes string) int {
	var sts *appsv1.StatefulSet
	var pdb *policyv1.PodDisruptionBudget
	services := map[string]*corev1.Service{}
	secrets := map[string]*corev1.Secret{}
	docs := bytes.Split(out, []byte("\n---\n"))
	for _, doc := range docs {
		var k kindOnly
		if err := yaml.Unmarshal(doc, &k); err != nil {
			fail("an object does not parse: %v", err)
			continue
		}
		what := k.Kind + "/" + k.Metadata.Name
		switch k.APIVersion + " " + k.Kind {
		case "apps/v1 StatefulSet":
			if sts != nil {
				fail("a second StatefulSet: %s", what)
			}
			sts = decode[appsv1.StatefulSet](doc, what)
		case "v1 Service":
			if s := decode[corev1.Service](doc, what); s != nil {
				services[s.Name] = s
			}
		case "policy/v1 PodDisruptionBudget":
			pdb = decode[policyv1.PodDisruptionBudget](doc, what)
		case "v1 Secret":
			if s := decode[corev1.Secret](doc, what); s != nil {
				secrets[s.Name] = s
			}
		default:
			fail("unexpected object %s %s", k.APIVersion, what)
		}
	}
	if sts == nil {
		fail("no StatefulSet (apps/v1)")
		return len(docs)
	}
	if pdb == nil {
		fail("no PodDisruptionBudget (policy/v1)")
	}
	def := entrypointDefaults(ep)
	spec := &sts.Spec
	pod := &spec.Template.Spec
	podLabels := labels.Set(spec.Template.Labels)

	// The container and the env the entrypoint reads.
	var c *corev1.Container
	for i := range pod.Containers {
		if pod.Containers[i].Name == "tierkvd" {
			c = &pod.Containers[i]
		}
	}
	if c == nil || len(pod.Containers) != 1 {
		fail("the pod must have exactly one container, tierkvd")
		return len(docs)
	}
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		if _, dup := env[e.Name]; dup {
			fail("env %s is given twice", e.Name)
		}
		env[e.Name] = e
		if strings.HasPrefix(e.Name, "TIERKV_K8S_") {
			if _, ok := def[e.Name]; !ok && e.Name != "TIERKV_K8S_POD_NAME" &&
				e.Name != "TIERKV_K8S_MEMORY_LIMIT_MI" && e.Name != "TIERKV_K8S_DNS_SUFFIX" {
				fail("env %s is not read by the entrypoint", e.Name)
			}
		}
	}
	setting := func(name string) string {
		if e, ok := env[name]; ok && e.ValueFrom == nil {
			return e.Value
		}
		return def[name]
	}
	if !strings.Contains(ep, `pod=${TIERKV_K8S_POD_NAME:-`) {
		fail("the entrypoint does not read TIERKV_K8S_POD_NAME")
	}
	if e, ok := env["TIERKV_K8S_POD_NAME"]; !ok || e.ValueFrom == nil || e.ValueFrom.FieldRef == nil ||
		e.ValueFrom.FieldRef.FieldPath != "metadata.name" {
		fail("TIERKV_K8S_POD_NAME must come from the downward API (fieldRef metadata.name)")
	}
	if len(c.Command) != 1 || c.Command[0] != entrypointPath {
		fail("the container's command must be [%s], not %v", entrypointPath, c.Command)
	}
	if len(c.Args) != 0 {
		fail("the container must take no args (the entrypoint takes none): %v", c.Args)
	}
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Exec == nil ||
		strings.Join(c.Lifecycle.PreStop.Exec.Command, " ") != entrypointPath+" prestop" {
		fail("preStop must exec [%s prestop]", entrypointPath)
	}
	if !strings.Contains(ep, `"${1:-}" = prestop`) {
		fail("the entrypoint has no prestop command")
	}
	if pod.TerminationGracePeriodSeconds == nil || *pod.TerminationGracePeriodSeconds < 30 {
		fail("terminationGracePeriodSeconds must leave the preStop's member removal time (>= 30)")
	}

	// The StatefulSet itself.
	initial, err := strconv.Atoi(setting("TIERKV_K8S_INITIAL_SIZE"))
	if err != nil || initial < 1 {
		fail("TIERKV_K8S_INITIAL_SIZE=%q is not a positive number", setting("TIERKV_K8S_INITIAL_SIZE"))
	}
	if spec.Replicas == nil || int(*spec.Replicas) != initial || initial != 3 {
		fail("replicas must be 3 and equal TIERKV_K8S_INITIAL_SIZE (%d)", initial)
	}
	if setting("TIERKV_K8S_STATEFULSET") != sts.Name {
		fail("TIERKV_K8S_STATEFULSET=%q is not the StatefulSet's name %q", setting("TIERKV_K8S_STATEFULSET"), sts.Name)
	}
	if spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		fail("podManagementPolicy must be Parallel (the first pods are ready only together), not %q", spec.PodManagementPolicy)
	}
	us := spec.UpdateStrategy
	if us.Type != appsv1.RollingUpdateStatefulSetStrategyType || us.RollingUpdate == nil ||
		us.RollingUpdate.MaxUnavailable == nil || us.RollingUpdate.MaxUnavailable.String() != "1" {
		fail("updateStrategy must be RollingUpdate with maxUnavailable 1")
	} else if us.RollingUpdate.Partition != nil && *us.RollingUpdate.Partition != 0 {
		fail("updateStrategy.rollingUpdate.partition must be 0")
	}
	if sel, err := metav1.LabelSelectorAsSelector(spec.Selector); err != nil || sel.Empty() || !sel.Matches(podLabels) {
		fail("the StatefulSet's selector does not select its pod template's labels")
	}

	// The volume: a PVC per pod at the entrypoint's volume path.
	volPath := setting("TIERKV_K8S_VOLUME")
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	dm, ok := mounts[volPath]
	if !ok || dm.ReadOnly {
		fail("nothing writable is mounted at the entrypoint's volume %s", volPath)
	} else {
		found := false
		for _, t := range spec.VolumeClaimTemplates {
			if t.Name == dm.Name {
				found = true
				if len(t.Spec.AccessModes) != 1 || t.Spec.AccessModes[0] != corev1.ReadWriteOnce {
					fail("the PVC %s must be ReadWriteOnce", t.Name)
				}
				if q, ok := t.Spec.Resources.Requests[corev1.ResourceStorage]; !ok || q.IsZero() {
					fail("the PVC %s requests no storage", t.Name)
				}
			}
		}
		if !found {
			fail("%s is mounted from %q, which is no volumeClaimTemplate (a PVC per pod)", volPath, dm.Name)
		}
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	for _, p := range []string{setting("TIERKV_K8S_RUN_DIR"), "/tmp"} {
		m, ok := mounts[p]
		if !ok || m.ReadOnly || volumes[m.Name].EmptyDir == nil {
			fail("%s must be a writable emptyDir (the root filesystem is read-only)", p)
		}
	}

	// Ports and probes.
	httpPort, _ := strconv.Atoi(setting("TIERKV_K8S_HTTP_PORT"))
	raftPort, _ := strconv.Atoi(setting("TIERKV_K8S_RAFT_PORT"))
	cport := map[string]int32{}
	for _, p := range c.Ports {
		cport[p.Name] = p.ContainerPort
	}
	resolve := func(p intstr.IntOrString) int32 {
		if p.Type == intstr.String {
			return cport[p.StrVal]
		}
		return p.IntVal
	}
	if cport["http"] != int32(httpPort) || cport["raft"] != int32(raftPort) {
		fail("the container ports http/raft (%d/%d) are not the entrypoint's (%d/%d)",
			cport["http"], cport["raft"], httpPort, raftPort)
	}
	probe := func(what string, p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil {
			fail("no %s probe (HTTP GET %s)", what, path)
			return
		}
		if p.HTTPGet.Path != path {
			fail("the %s probe asks for %q, not %s", what, p.HTTPGet.Path, path)
		}
		if !strings.Contains(routes, "HTTP_GET, \""+path+"\"") {
			fail("%s is not a GET route of the gateway (gateway/gateway_internal.h)", path)
		}
		if got := resolve(p.HTTPGet.Port); got != int32(httpPort) {
			fail("the %s probe's port %s is %d, not the HTTP port %d", what, p.HTTPGet.Port.String(), got, httpPort)
		}
		if p.HTTPGet.Scheme != "" && p.HTTPGet.Scheme != corev1.URISchemeHTTP {
			fail("the %s probe's scheme is %s; tierkvd serves HTTP here", what, p.HTTPGet.Scheme)
		}
	}
	probe("readiness", c.ReadinessProbe, "/readyz")
	probe("liveness", c.LivenessProbe, "/healthz")
	if c.StartupProbe != nil {
		probe("startup", c.StartupProbe, "/healthz")
	}

	// Services.
	peer := services[spec.ServiceName]
	if peer == nil {
		fail("serviceName %q names no Service", spec.ServiceName)
	} else {
		if peer.Spec.ClusterIP != corev1.ClusterIPNone {
			fail("the peer Service %s must be headless (clusterIP: None)", peer.Name)
		}
		if !peer.Spec.PublishNotReadyAddresses {
			fail("the peer Service %s must publish not-ready addresses (no pod is ready before a leader is elected)", peer.Name)
		}
		if setting("TIERKV_K8S_PEER_SERVICE") != peer.Name {
			fail("TIERKV_K8S_PEER_SERVICE=%q is not the StatefulSet's serviceName %q", setting("TIERKV_K8S_PEER_SERVICE"), peer.Name)
		}
		want := map[int32]bool{int32(raftPort): false, int32(httpPort): false}
		for _, p := range peer.Spec.Ports {
			if resolve(p.TargetPort) != p.Port {
				fail("the peer Service's port %d goes to container port %d", p.Port, resolve(p.TargetPort))
			}
			want[p.Port] = true
		}
		for p, ok := range want {
			if !ok {
				fail("the peer Service has no port %d", p)
			}
		}
	}
	clientHost, clientPort, _ := strings.Cut(setting("TIERKV_K8S_CLIENT"), ":")
	for _, s := range services {
		if !labels.SelectorFromSet(s.Spec.Selector).Matches(podLabels) || len(s.Spec.Selector) == 0 {
			fail("the Service %s does not select the StatefulSet's pods", s.Name)
		}
		if s.Name == spec.ServiceName {
			continue
		}
		if s.Name != clientHost {
			fail("Service %s is neither the peer Service nor the client one (TIERKV_K8S_CLIENT=%s)", s.Name, setting("TIERKV_K8S_CLIENT"))
			continue
		}
		ok := false
		for _, p := range s.Spec.Ports {
			if strconv.Itoa(int(p.Port)) == clientPort {
				ok = resolve(p.TargetPort) == int32(httpPort)
			}
		}
		if !ok {
			fail("the client Service %s has no port %s going to the HTTP port %d", s.Name, clientPort, httpPort)
		}
	}
	if services[clientHost] == nil {
		fail("TIERKV_K8S_CLIENT=%q names no Service", setting("TIERKV_K8S_CLIENT"))
	}

	// The PDB.
	if pdb != nil {
		if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.String() != "1" || pdb.Spec.MinAvailable != nil {
			fail("the PDB must have maxUnavailable 1 (and no minAvailable)")
		}
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || sel.Empty() || !sel.Matches(podLabels) {
			fail("the PDB does not select the StatefulSet's pods")
		}
		if sel != nil && spec.Selector != nil && !sel.Matches(labels.Set(spec.Selector.MatchLabels)) {
			fail("the PDB's selector is not the StatefulSet's")
		}
	}

	// Anti-affinity.
	aff := pod.Affinity
	okAff := false
	if aff != nil && aff.PodAntiAffinity != nil {
		for _, t := range aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
			sel, err := metav1.LabelSelectorAsSelector(t.LabelSelector)
			if err == nil && t.TopologyKey == "kubernetes.io/hostname" && !sel.Empty() && sel.Matches(podLabels) {
				okAff = true
			}
		}
	}
	if !okAff {
		fail("no required pod anti-affinity on kubernetes.io/hostname selecting the pods")
	}

	// Security.
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		fail("the pod must run as a non-root uid (runAsNonRoot, runAsUser)")
	}
	if psc == nil || psc.FSGroup == nil || psc.RunAsUser == nil || *psc.FSGroup != *psc.RunAsUser {
		fail("fsGroup must be the tierkv group (the volume and the Secret must be readable by it)")
	}
	csc := c.SecurityContext
	if csc == nil || csc.ReadOnlyRootFilesystem == nil || !*csc.ReadOnlyRootFilesystem {
		fail("the container must have readOnlyRootFilesystem: true")
	}
	if csc == nil || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation {
		fail("the container must have allowPrivilegeEscalation: false")
	}
	if csc == nil || csc.Capabilities == nil || len(csc.Capabilities.Drop) != 1 || csc.Capabilities.Drop[0] != "ALL" {
		fail("the container must drop ALL capabilities")
	}
	if csc != nil && csc.Privileged != nil && *csc.Privileged {
		fail("the container must not be privileged")
	}

	// Resources tied to the memory budget.
	req, lim := c.Resources.Requests, c.Resources.Limits
	ml, okl := lim[corev1.ResourceMemory]
	mr, okr := req[corev1.ResourceMemory]
	if !okl || !okr || ml.Cmp(mr) != 0 {
		fail("the memory request must equal the limit (a node is not to be killed for memory it was promised)")
	}
	if okl && ml.Cmp(resource.MustParse("256Mi")) < 0 {
		fail("the memory limit %s is under 256Mi (the budget, half of it, must be at least 128M)", ml.String())
	}
	if _, ok := req[corev1.ResourceCPU]; !ok {
		fail("no CPU request")
	}
	e, ok := env["TIERKV_K8S_MEMORY_LIMIT_MI"]
	if !ok || e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil ||
		e.ValueFrom.ResourceFieldRef.Resource != "limits.memory" ||
		(e.ValueFrom.ResourceFieldRef.ContainerName != "" && e.ValueFrom.ResourceFieldRef.ContainerName != c.Name) ||
		e.ValueFrom.ResourceFieldRef.Divisor.Cmp(resource.MustParse("1Mi")) != 0 {
		fail("TIERKV_K8S_MEMORY_LIMIT_MI must be the container's limits.memory in Mi (resourceFieldRef, divisor 1Mi)")
	}
	if !strings.Contains(ep, "k8s_budget \"$TIERKV_K8S_MEMORY_LIMIT_MI\"") {
		fail("the entrypoint does not derive the budget from TIERKV_K8S_MEMORY_LIMIT_MI")
	}
	if _, ok := env["TIERKV_MEMORY_BUDGET"]; ok {
		fail("TIERKV_MEMORY_BUDGET is set: the budget must follow the limit")
	}

	// Secrets.
	secretDir := setting("TIERKV_K8S_SECRET_DIR")
	if !strings.Contains(ep, `"$secret_dir/peer-token"`) {
		fail("the entrypoint does not read peer-token from its secret dir")
	}
	sm, ok := mounts[secretDir]
	var sv *corev1.SecretVolumeSource
	if ok {
		sv = volumes[sm.Name].Secret
	}
	if sv == nil {
		fail("no Secret is mounted at the entrypoint's secret dir %s", secretDir)
	} else {
		s := secrets[sv.SecretName]
		if s == nil {
			fail("the Secret %s mounted at %s is not in the build", sv.SecretName, secretDir)
		} else {
			_, inData := s.Data["peer-token"]
			_, inString := s.StringData["peer-token"]
			if !inData && !inString {
				fail("the Secret %s has no key peer-token", s.Name)
			}
		}
		for _, it := range sv.Items {
			if it.Key != "peer-token" || it.Path != "peer-token" {
				fail("the Secret volume maps %s to %s; the entrypoint reads peer-token", it.Key, it.Path)
			}
		}
		if sv.Optional != nil && *sv.Optional {
			fail("the peer token's Secret must not be optional")
		}
	}
	tm, ok := mounts[setting("TIERKV_K8S_TLS_DIR")]
	if ok {
		tv := volumes[tm.Name].Secret
		if tv == nil || tv.Optional == nil || !*tv.Optional {
			fail("the peer TLS volume must be an optional Secret")
		}
	}
	return len(docs)
}
