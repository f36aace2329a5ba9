package identity

import (
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// oidSubjectAltName is the X.509 subjectAltName extension.
var oidSubjectAltName = asn1.ObjectIdentifier{2, 5, 29, 17}

// maxURISANs bounds the URI SANs of one certificate examined at all.
const maxURISANs = 16

// uriSANs returns a certificate's URI SANs exactly as they are written in it. crypto/x509 keeps
// them only as parsed *url.URL values, and url.Parse lower-cases the scheme and unescapes the host:
// "SPIFFE://nodefence/..." and "spiffe://nodef%65nce/..." would read back as the canonical
// spelling. An identity must be written canonically, so the written text is what is checked.
func uriSANs(c *x509.Certificate) ([]string, error) {
	var out []string
	for _, ext := range c.Extensions {
		if !ext.Id.Equal(oidSubjectAltName) {
			continue
		}
		var seq asn1.RawValue
		rest, err := asn1.Unmarshal(ext.Value, &seq)
		if err != nil || len(rest) != 0 || seq.Class != asn1.ClassUniversal || seq.Tag != asn1.TagSequence || !seq.IsCompound {
			return nil, errors.New("the certificate's subjectAltName extension is malformed")
		}
		names := seq.Bytes
		for len(names) > 0 {
			var n asn1.RawValue
			if names, err = asn1.Unmarshal(names, &n); err != nil {
				return nil, errors.New("the certificate's subjectAltName extension is malformed")
			}
			// GeneralName uniformResourceIdentifier: [6] IA5String, implicitly tagged.
			if n.Class == asn1.ClassContextSpecific && n.Tag == 6 && !n.IsCompound {
				if len(out) == maxURISANs {
					return nil, fmt.Errorf("the certificate has more than %d URI SANs", maxURISANs)
				}
				out = append(out, string(n.Bytes))
			}
		}
	}
	return out, nil
}

// inTrustDomain reports whether a URI, in any spelling, claims nodefence's trust domain: a spiffe
// scheme in any letter case and a host that is "nodefence" in any case or escaping (with or without
// user information or a port). Such a URI is either exactly canonical or refused; a URI of another
// scheme or trust domain is someone else's and ignored.
func inTrustDomain(s string) bool {
	scheme, _, ok := strings.Cut(s, ":")
	if !ok || !strings.EqualFold(scheme, "spiffe") {
		return false
	}
	u, err := url.Parse(s)
	if err != nil {
		return true // a spiffe URI that is not even a URI: refused, not ignored
	}
	return strings.EqualFold(u.Hostname(), TrustDomain)
}
