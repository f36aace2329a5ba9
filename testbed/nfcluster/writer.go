package nfcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/nodefence/nodefence/testbed/cluster"
)

// WriterNamespace holds the writer StatefulSets.
const WriterNamespace = "default"

// writerScript is the writer's program: one start line saying how many lines it found (its
// data), then a line "<pod uid> <seq> <node>" appended every 100 ms to the shared volume.
const writerScript = `n=0
echo "start $POD_UID $NODE_NAME found=$(cat /data/log 2>/dev/null | wc -l)" >> /data/log
while true; do
  echo "$POD_UID $n $NODE_NAME" >> /data/log
  n=$((n+1))
  sleep 0.1
done`

// Writer is a one-replica StatefulSet whose pod appends to a file on a hostPath PersistentVolume
// with no node affinity: every node sees the same directory (one machine), so the pod finds its
// data wherever it runs, and the file shows whether two pods ever wrote at once.
type Writer struct {
	Name string // the StatefulSet; its pod is Name-0
	// Log is the file the pods append to, on the host.
	Log string
	cs  *kubernetes.Clientset
}

// Pod is the name of the writer's pod.
func (w *Writer) Pod() string { return w.Name + "-0" }

// CreateWriter creates the PersistentVolume (under the cluster's shared directory), the
// StatefulSet and a headless Service; the pod prefers the node named prefer (it may run elsewhere).
func CreateWriter(ctx context.Context, c *cluster.Cluster, name, prefer string) (*Writer, error) {
	cs, err := c.Admin()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(c.SharedDir(), name)
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return nil, err
	}
	w := &Writer{Name: name, Log: filepath.Join(dir, "log"), cs: cs}
	hostPathType := corev1.HostPathDirectoryOrCreate
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-pv"},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "",
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: &hostPathType}},
			ClaimRef:                      &corev1.ObjectReference{Namespace: WriterNamespace, Name: "data-" + w.Pod()},
		},
	}
	if _, err := cs.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	labels := map[string]string{"app": name}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: WriterNamespace},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: labels, Ports: []corev1.ServicePort{{Port: 80}}}}
	if _, err := cs.CoreV1().Services(WriterNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	grace := int64(5)
	one := int32(1)
	empty := ""
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: WriterNamespace},
		Spec: appsv1.StatefulSetSpec{
			ServiceName: name, Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: &grace,
					Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
						PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 100,
							Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{
								Key: "kubernetes.io/hostname", Operator: corev1.NodeSelectorOpIn, Values: []string{prefer}}}}}}}},
					Containers: []corev1.Container{{
						Name: "writer", Image: cluster.BusyboxImage, ImagePullPolicy: corev1.PullNever,
						Command: []string{"sh", "-c", writerScript},
						Env: []corev1.EnvVar{
							{Name: "POD_UID", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.uid"}}},
							{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
					}},
				},
			},
			VolumeClaimTemplates: []corev1.PersistentVolumeClaim{{
				ObjectMeta: metav1.ObjectMeta{Name: "data"},
				Spec: corev1.PersistentVolumeClaimSpec{
					AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, StorageClassName: &empty,
					VolumeName: pv.Name,
					Resources:  corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
				},
			}},
		},
	}
	if _, err := cs.AppsV1().StatefulSets(WriterNamespace).Create(ctx, sts, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	return w, nil
}

// RunningPod waits until the writer's pod is Running and Ready, with a UID other than not (empty:
// any), and returns it.
func (w *Writer) RunningPod(ctx context.Context, not types.UID, timeout time.Duration) (*corev1.Pod, error) {
	deadline := time.Now().Add(timeout)
	var last string
	for {
		p, err := w.cs.CoreV1().Pods(WriterNamespace).Get(ctx, w.Pod(), metav1.GetOptions{})
		switch {
		case err != nil:
			last = err.Error()
		case p.UID == not:
			last = fmt.Sprintf("still the old pod %s on %s (phase %s, deleting %v)", p.UID, p.Spec.NodeName, p.Status.Phase, p.DeletionTimestamp != nil)
		case p.Status.Phase == corev1.PodRunning && podReady(p) && p.DeletionTimestamp == nil:
			return p, nil
		default:
			last = fmt.Sprintf("pod %s on %q: phase %s", p.UID, p.Spec.NodeName, p.Status.Phase)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("writer %s not running within %s: %s", w.Name, timeout, last)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Delete removes the StatefulSet, its pod (force-deleted: its node may be dead), claim, volume
// and Service, and waits up to a minute for the pod to be gone.
func (w *Writer) Delete(ctx context.Context) error {
	bg := metav1.DeletePropagationBackground
	zero := int64(0)
	var errs []error
	ignore := func(err error) {
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	ignore(w.cs.AppsV1().StatefulSets(WriterNamespace).Delete(ctx, w.Name, metav1.DeleteOptions{PropagationPolicy: &bg}))
	ignore(w.cs.CoreV1().Services(WriterNamespace).Delete(ctx, w.Name, metav1.DeleteOptions{}))
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(250 * time.Millisecond) {
		_, err := w.cs.CoreV1().Pods(WriterNamespace).Get(ctx, w.Pod(), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		ignore(w.cs.CoreV1().Pods(WriterNamespace).Delete(ctx, w.Pod(), metav1.DeleteOptions{GracePeriodSeconds: &zero}))
		if time.Now().After(deadline) {
			errs = append(errs, fmt.Errorf("pod %s not gone", w.Pod()))
			break
		}
	}
	ignore(w.cs.CoreV1().PersistentVolumeClaims(WriterNamespace).Delete(ctx, "data-"+w.Pod(), metav1.DeleteOptions{}))
	ignore(w.cs.CoreV1().PersistentVolumes().Delete(ctx, w.Name+"-pv", metav1.DeleteOptions{}))
	return errors.Join(errs...)
}

// Lines returns the writer's log lines.
func (w *Writer) Lines() ([]string, error) {
	data, err := os.ReadFile(w.Log)
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimRight(string(data), "\n"), "\n"), nil
}

// Episode is one writer pod's run in the log.
type Episode struct {
	UID   string
	Node  string
	Found int // lines the pod found at its start
	First int // index of its first line (the start line)
	Last  int // index of its last line
	Lines int // its "<uid> <seq> <node>" lines
}

// CheckOneWriter reads a writer log and returns the pods' episodes in order of their start. It
// fails when two pods ever wrote at once: when a line of a pod appears after another pod's first
// line, that is, the old writer's last write does not precede the new one's first. It also fails
// on lines it cannot read and on sequence numbers that do not count up from 0 in each pod.
func CheckOneWriter(lines []string) ([]Episode, error) {
	var eps []Episode
	index := map[string]int{}
	for i, line := range lines {
		f := strings.Fields(line)
		var uid string
		var start bool
		switch {
		case len(f) == 4 && f[0] == "start" && strings.HasPrefix(f[3], "found="):
			uid, start = f[1], true
		case len(f) == 3:
			uid = f[0]
		default:
			return eps, fmt.Errorf("line %d: unreadable %q", i+1, line)
		}
		k, seen := index[uid]
		if !seen {
			if !start {
				return eps, fmt.Errorf("line %d: pod %s writes without a start line", i+1, uid)
			}
			found, err := strconv.Atoi(strings.TrimPrefix(f[3], "found="))
			if err != nil {
				return eps, fmt.Errorf("line %d: %v", i+1, err)
			}
			index[uid] = len(eps)
			eps = append(eps, Episode{UID: uid, Node: f[2], Found: found, First: i, Last: i})
			continue
		}
		if start {
			return eps, fmt.Errorf("line %d: pod %s starts twice", i+1, uid)
		}
		if k != len(eps)-1 {
			return eps, fmt.Errorf("line %d: two writers: pod %s (on %s) wrote after pod %s (on %s) started at line %d",
				i+1, uid, eps[k].Node, eps[len(eps)-1].UID, eps[len(eps)-1].Node, eps[len(eps)-1].First+1)
		}
		seq, err := strconv.Atoi(f[1])
		if err != nil || seq != eps[k].Lines {
			return eps, fmt.Errorf("line %d: pod %s sequence %q, want %d", i+1, uid, f[1], eps[k].Lines)
		}
		eps[k].Lines++
		eps[k].Last = i
	}
	return eps, nil
}
