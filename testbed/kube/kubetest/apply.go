package kubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// ReadObjects decodes every object of a YAML or JSON file holding one or more documents.
func ReadObjects(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(m) == 0 {
			continue
		}
		out = append(out, &unstructured.Unstructured{Object: m})
	}
}

// Kustomization is the part of a kustomization.yaml this package understands: a namespace and a
// list of plain resource files.
type Kustomization struct {
	Namespace string   `json:"namespace"`
	Resources []string `json:"resources"`
}

// ReadKustomization reads the objects of the kustomization in dir: every resource file, with the
// namespaced objects checked against the kustomization's namespace. It is no kustomize:
// only plain files are supported, which is all nodefence's deploy/ uses. It also returns the files.
func ReadKustomization(dir string) (objs []*unstructured.Unstructured, files []string, err error) {
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, nil, err
	}
	var k Kustomization
	if err := yaml.UnmarshalStrict(data, &struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		*Kustomization
		Images []any `json:"images"`
	}{Kustomization: &k}); err != nil {
		return nil, nil, fmt.Errorf("%s/kustomization.yaml: %w", dir, err)
	}
	for _, r := range k.Resources {
		path := filepath.Join(dir, r)
		o, err := ReadObjects(path)
		if err != nil {
			return nil, nil, err
		}
		for _, obj := range o {
			if k.Namespace != "" && obj.GetNamespace() != "" && obj.GetNamespace() != k.Namespace {
				return nil, nil, fmt.Errorf("%s: %s %s in namespace %s, kustomization says %s", path, obj.GetKind(), obj.GetName(), obj.GetNamespace(), k.Namespace)
			}
		}
		objs = append(objs, o...)
		files = append(files, path)
	}
	return objs, files, nil
}

// Applier applies objects with server-side apply through a discovery-backed REST mapper, so it
// knows custom resources once their CRD is established.
type Applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

// NewApplier returns an Applier for cfg.
func NewApplier(cfg *rest.Config) (*Applier, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}, nil
}

// Apply server-side applies obj (field manager "kubetest", forced); with dryRun the apiserver
// validates and admits it without storing it.
func (a *Applier) Apply(ctx context.Context, obj *unstructured.Unstructured, dryRun bool) (*unstructured.Unstructured, error) {
	gvk := obj.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		a.mapper.Reset()
		m, err = a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", gvk, obj.GetName(), err)
	}
	var ri dynamic.ResourceInterface = a.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if obj.GetNamespace() == "" {
			return nil, fmt.Errorf("%s %s: namespaced, but no namespace", gvk.Kind, obj.GetName())
		}
		ri = a.dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
	}
	opts := metav1.ApplyOptions{FieldManager: "kubetest", Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	out, err := ri.Apply(ctx, obj.GetName(), obj, opts)
	if err != nil {
		return nil, fmt.Errorf("apply %s %s/%s: %w", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
	}
	return out, nil
}

// WaitForResource polls until resource can be listed (a custom resource may 404 for a moment after
// its CRD is established), then resets the Applier's mapper.
func (a *Applier) WaitForResource(ctx context.Context, gvr schema.GroupVersionResource) error {
	for {
		_, err := a.dyn.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1})
		if err == nil {
			a.mapper.Reset()
			return nil
		}
		if !apierrors.IsNotFound(err) && !meta.IsNoMatchError(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s not served: %w", gvr, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// ApplyFiles applies every object of the manifest files under dir, in order, for real.
func (a *Applier) ApplyFiles(ctx context.Context, dir string, files ...string) error {
	for _, f := range files {
		objs, err := ReadObjects(filepath.Join(dir, f))
		if err != nil {
			return err
		}
		for _, o := range objs {
			if _, err := a.Apply(ctx, o, false); err != nil {
				return fmt.Errorf("%s: %s %s: %w", f, o.GetKind(), o.GetName(), err)
			}
		}
	}
	return nil
}
