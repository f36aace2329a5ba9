package nfcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/nodefence/nodefence/coordinator/admit"
)

// webhookFile is deploy/'s node-agent admission webhook.
const webhookFile = "webhook-node-agent.yaml"

// applyWebhook installs deploy/webhook-node-agent.yaml as shipped (rules, match conditions,
// failure policy), except for where the apiserver reaches it: the first coordinator's webhook
// address (no Service: the coordinators run on the host), with the deployment's CA as caBundle,
// as deploy/README.md says to set it without cert-manager.
func (d *Deployment) applyWebhook(ctx context.Context, admin *kubernetes.Clientset) error {
	raw, err := os.ReadFile(filepath.Join(DeployDir(), webhookFile))
	if err != nil {
		return err
	}
	var cfg admissionregistrationv1.ValidatingWebhookConfiguration
	if err := yaml.UnmarshalStrict(raw, &cfg); err != nil {
		return fmt.Errorf("%s: %w", webhookFile, err)
	}
	ca, err := os.ReadFile(d.caFile)
	if err != nil {
		return err
	}
	url := "https://" + d.Coordinators[0].AdmissionAddr + admit.Path
	for i := range cfg.Webhooks {
		cfg.Webhooks[i].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: ca}
	}
	api := admin.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	old, err := api.Get(ctx, cfg.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = api.Create(ctx, &cfg, metav1.CreateOptions{})
	case err == nil:
		cfg.ResourceVersion = old.ResourceVersion
		_, err = api.Update(ctx, &cfg, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("%s: %w", webhookFile, err)
	}
	return nil
}

// removeWebhook deletes the webhook configuration, which would otherwise send the agents'
// requests of a later deployment on the same cluster to a coordinator that is gone.
func (d *Deployment) removeWebhook() {
	admin, err := d.Cluster.Admin()
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name := "nodefence-node-agent-own-node"
	if err := admin.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		d.Opts.Log.Warn("removing the node-agent webhook failed", "err", err)
	}
}
