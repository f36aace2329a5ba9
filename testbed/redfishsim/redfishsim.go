// Package redfishsim is an in-process Redfish service (a BMC) over HTTPS on 127.0.0.1 for tests
// and demos. It serves the real DMTF schema as fence_redfish and gofish read it: the service root
// (/redfish/v1), the Systems collection, ComputerSystem resources with PowerState and the
// #ComputerSystem.Reset action (ResetType@Redfish.AllowableValues), and the SessionService.
// Requests authenticate with HTTP Basic or an X-Auth-Token from a session.
//
// Each system keeps its power state. Power changes may take time (PoweringOff / PoweringOn in
// between), and per-system faults simulate a stuck system (Reset accepted, nothing happens), a
// failing one (Reset answered with an error), a flapping PowerState, and the whole service can
// hang (connections accepted, no answer).
//
// The service fails by default: without a configured user and password every authenticated
// request is refused, unknown resources are 404, and unsupported reset types are 400.
package redfishsim

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nodefence/nodefence/testbed/hanglistener"
)

// Fault is a failure mode of one system.
type Fault int

const (
	// FaultNone is a healthy system.
	FaultNone Fault = iota
	// FaultStuck accepts Reset (204) but never changes power.
	FaultStuck
	// FaultResetError answers Reset with 500 and an error body, changing nothing.
	FaultResetError
	// FaultFlapping reports PowerState alternately On and Off on successive reads.
	FaultFlapping
)

// AllowedResetTypes are the reset types every system accepts.
var AllowedResetTypes = []string{"On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi", "ForceOn", "PushPowerButton"}

// Config configures a service.
type Config struct {
	// Systems is the number of systems, with Ids "1".."N". Default 1.
	Systems int
	// User and Password are the only credentials accepted.
	User, Password string
	// Transition is how long a power change takes (PowerState PoweringOff or PoweringOn
	// meanwhile). Default 0: immediate.
	Transition time.Duration
	// Log receives request lines. Default: discarded.
	Log *slog.Logger
}

type system struct {
	on       bool
	changeAt time.Time // when a pending change completes; zero if none
	target   bool      // the pending change's power
	fault    Fault
	reads    int
	resets   []string
}

// Service is one running Redfish service.
type Service struct {
	cfg    Config
	ln     net.Listener
	srv    *http.Server
	caPEM  []byte
	client *http.Client

	mu       sync.Mutex
	systems  []system
	sessions map[string]string // token -> session id
	nextSess int
	hl       *hanglistener.Listener
	requests int
}

// Start starts the service on a free port of 127.0.0.1 with a fresh CA and certificate for
// 127.0.0.1 and localhost. Systems start powered on.
func Start(cfg Config) (*Service, error) {
	if cfg.Systems == 0 {
		cfg.Systems = 1
	}
	if cfg.Systems < 1 || cfg.Systems > 1000 {
		return nil, fmt.Errorf("redfishsim: Systems must be 1-1000, got %d", cfg.Systems)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Service{cfg: cfg, systems: make([]system, cfg.Systems), sessions: map[string]string{}}
	for i := range s.systems {
		s.systems[i].on = true
	}
	cert, caPEM, err := selfSigned()
	if err != nil {
		return nil, err
	}
	s.caPEM = caPEM
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s.ln = ln
	s.srv = &http.Server{
		Handler:           s,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(cfg.Log.Handler(), slog.LevelDebug),
	}
	s.hl = hanglistener.New(ln)
	go func() { _ = s.srv.ServeTLS(s.hl, "", "") }()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	s.client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	return s, nil
}

// URL is the service's base URL, https://127.0.0.1:port.
func (s *Service) URL() string { return "https://" + s.ln.Addr().String() }

// Port is the HTTPS port on 127.0.0.1.
func (s *Service) Port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// CAPEM is the PEM of the CA that signed the service's certificate.
func (s *Service) CAPEM() []byte { return bytes.Clone(s.caPEM) }

// Close stops the service.
func (s *Service) Close() error {
	s.hl.CloseHung()
	return s.srv.Close()
}

// SystemURI is the URI of system id (1-based).
func SystemURI(id int) string { return "/redfish/v1/Systems/" + strconv.Itoa(id) }

func (s *Service) sys(id int) (*system, error) {
	if id < 1 || id > len(s.systems) {
		return nil, fmt.Errorf("redfishsim: no system %d", id)
	}
	return &s.systems[id-1], nil
}

// settle applies a pending change whose time has come.
func (sy *system) settle(now time.Time) {
	if !sy.changeAt.IsZero() && !now.Before(sy.changeAt) {
		sy.on, sy.changeAt = sy.target, time.Time{}
	}
}

// On reports whether system id is powered on (its true state, whatever the faults).
func (s *Service) On(id int) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sy, err := s.sys(id)
	if err != nil {
		return false, err
	}
	sy.settle(time.Now())
	return sy.on, nil
}

// SetOn sets system id's power directly.
func (s *Service) SetOn(id int, on bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sy, err := s.sys(id)
	if err != nil {
		return err
	}
	sy.on, sy.changeAt = on, time.Time{}
	return nil
}

// SetFault sets system id's failure mode.
func (s *Service) SetFault(id int, f Fault) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sy, err := s.sys(id)
	if err != nil {
		return err
	}
	sy.fault = f
	return nil
}

// SetHang makes the service accept new connections and never answer on them (hang true).
func (s *Service) SetHang(hang bool) { s.hl.SetHang(hang) }

// Resets returns the reset types system id received, oldest first.
func (s *Service) Resets(id int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	sy, err := s.sys(id)
	if err != nil {
		return nil
	}
	return slices.Clone(sy.resets)
}

// Requests returns the number of HTTP requests served.
func (s *Service) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// Sessions returns the number of open Redfish sessions (created and not deleted).
func (s *Service) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// Client is an HTTPS client trusting the service's CA, for tests reading the service directly.
func (s *Service) Client() *http.Client { return s.client }

// redfishError writes a Redfish error body.
func redfishError(w http.ResponseWriter, code int, id, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("OData-Version", "4.0")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"code": "Base.1.8." + id, "message": msg,
		"@Message.ExtendedInfo": []any{map[string]any{
			"@odata.type": "#Message.v1_1_1.Message", "MessageId": "Base.1.8." + id, "Message": msg, "Severity": "Critical",
		}},
	}})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("OData-Version", "4.0")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func ref(uri string) map[string]string { return map[string]string{"@odata.id": uri} }

// authorized checks Basic credentials or a session token.
func (s *Service) authorized(r *http.Request) bool {
	if tok := r.Header.Get("X-Auth-Token"); tok != "" {
		s.mu.Lock()
		_, ok := s.sessions[tok]
		s.mu.Unlock()
		return ok
	}
	u, p, ok := r.BasicAuth()
	return ok && s.credentialsOK(u, p)
}

func (s *Service) credentialsOK(u, p string) bool {
	return s.cfg.User != "" && s.cfg.Password != "" && u == s.cfg.User && p == s.cfg.Password
}

// ServeHTTP routes a request.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests++
	s.mu.Unlock()
	path := strings.TrimSuffix(r.URL.Path, "/")
	s.cfg.Log.Debug("redfish request", "method", r.Method, "path", path)
	switch {
	case path == "/redfish" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]string{"v1": "/redfish/v1/"})
		return
	case path == "/redfish/v1" && r.Method == http.MethodGet:
		s.serviceRoot(w)
		return
	case path == "/redfish/v1/SessionService/Sessions" && r.Method == http.MethodPost:
		s.createSession(w, r)
		return
	}
	if !s.authorized(r) {
		w.Header().Set("WWW-Authenticate", `Basic realm="redfishsim"`)
		redfishError(w, http.StatusUnauthorized, "NoValidSession", "There is no valid session established with the implementation.")
		return
	}
	parts := strings.Split(strings.TrimPrefix(path, "/redfish/v1/"), "/")
	switch {
	case path == "/redfish/v1/Systems" && r.Method == http.MethodGet:
		s.systemsCollection(w)
	case len(parts) == 2 && parts[0] == "Systems" && r.Method == http.MethodGet:
		s.computerSystem(w, parts[1])
	case len(parts) == 4 && parts[0] == "Systems" && parts[2] == "Actions" && parts[3] == "ComputerSystem.Reset":
		if r.Method != http.MethodPost {
			redfishError(w, http.StatusMethodNotAllowed, "OperationNotAllowed", "Only POST is allowed on an action.")
			return
		}
		s.reset(w, r, parts[1])
	case path == "/redfish/v1/SessionService" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{
			"@odata.id": "/redfish/v1/SessionService", "@odata.type": "#SessionService.v1_1_8.SessionService",
			"Id": "SessionService", "Name": "Session Service", "ServiceEnabled": true, "SessionTimeout": 600,
			"Sessions": ref("/redfish/v1/SessionService/Sessions"),
		})
	case len(parts) == 3 && parts[0] == "SessionService" && parts[1] == "Sessions" && r.Method == http.MethodDelete:
		s.mu.Lock()
		for tok, id := range s.sessions {
			if id == parts[2] {
				delete(s.sessions, tok)
			}
		}
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	default:
		redfishError(w, http.StatusNotFound, "ResourceMissingAtURI", "The resource at the URI "+r.URL.Path+" was not found.")
	}
}

func (s *Service) serviceRoot(w http.ResponseWriter) {
	writeJSON(w, http.StatusOK, map[string]any{
		"@odata.context": "/redfish/v1/$metadata#ServiceRoot.ServiceRoot",
		"@odata.id":      "/redfish/v1", "@odata.type": "#ServiceRoot.v1_5_0.ServiceRoot",
		"Id": "RootService", "Name": "Root Service", "RedfishVersion": "1.6.0",
		"UUID":           "92384634-2938-2342-8820-489239905423",
		"Systems":        ref("/redfish/v1/Systems"),
		"SessionService": ref("/redfish/v1/SessionService"),
		"Links":          map[string]any{"Sessions": ref("/redfish/v1/SessionService/Sessions")},
	})
}

func (s *Service) systemsCollection(w http.ResponseWriter) {
	members := make([]map[string]string, len(s.systems))
	for i := range s.systems {
		members[i] = ref(SystemURI(i + 1))
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"@odata.id": "/redfish/v1/Systems", "@odata.type": "#ComputerSystemCollection.ComputerSystemCollection",
		"Name": "Computer System Collection", "Members@odata.count": len(members), "Members": members,
	})
}

func (s *Service) lookup(id string) (int, *system) {
	n, err := strconv.Atoi(id)
	if err != nil || n < 1 || n > len(s.systems) || strconv.Itoa(n) != id {
		return 0, nil
	}
	return n, &s.systems[n-1]
}

func (s *Service) computerSystem(w http.ResponseWriter, id string) {
	s.mu.Lock()
	n, sy := s.lookup(id)
	if sy == nil {
		s.mu.Unlock()
		redfishError(w, http.StatusNotFound, "ResourceMissingAtURI", "The resource at the URI /redfish/v1/Systems/"+id+" was not found.")
		return
	}
	now := time.Now()
	sy.settle(now)
	state := "Off"
	switch {
	case sy.fault == FaultFlapping:
		if sy.reads%2 == 0 {
			state = "On"
		}
		sy.reads++
	case !sy.changeAt.IsZero() && sy.target:
		state = "PoweringOn"
	case !sy.changeAt.IsZero():
		state = "PoweringOff"
	case sy.on:
		state = "On"
	}
	s.mu.Unlock()
	uri := SystemURI(n)
	w.Header().Set("ETag", fmt.Sprintf(`W/"%s-%d"`, state, n))
	writeJSON(w, http.StatusOK, map[string]any{
		"@odata.id": uri, "@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem",
		"Id": id, "Name": "System " + id, "SystemType": "Physical", "Manufacturer": "nodefence",
		"Model": "redfishsim", "SerialNumber": fmt.Sprintf("SIM%05d", n), "PowerState": state,
		"Status": map[string]string{"State": "Enabled", "Health": "OK"},
		"Actions": map[string]any{"#ComputerSystem.Reset": map[string]any{
			"target":                            uri + "/Actions/ComputerSystem.Reset",
			"ResetType@Redfish.AllowableValues": AllowedResetTypes,
		}},
	})
}

func (s *Service) reset(w http.ResponseWriter, r *http.Request, id string) {
	var body struct{ ResetType string }
	data, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	if err != nil || json.Unmarshal(data, &body) != nil {
		redfishError(w, http.StatusBadRequest, "MalformedJSON", "The request body submitted was malformed JSON.")
		return
	}
	if !slices.Contains(AllowedResetTypes, body.ResetType) {
		redfishError(w, http.StatusBadRequest, "ActionParameterValueNotInList",
			fmt.Sprintf("The value %q for the parameter ResetType is not in the list of acceptable values.", body.ResetType))
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, sy := s.lookup(id)
	if sy == nil {
		redfishError(w, http.StatusNotFound, "ResourceMissingAtURI", "The resource at the URI "+r.URL.Path+" was not found.")
		return
	}
	sy.resets = append(sy.resets, body.ResetType)
	switch sy.fault {
	case FaultStuck:
		w.WriteHeader(http.StatusNoContent)
		return
	case FaultResetError:
		redfishError(w, http.StatusInternalServerError, "InternalError", "The request failed due to an internal service error: power controller not responding.")
		return
	}
	now := time.Now()
	sy.settle(now)
	var want bool
	switch body.ResetType {
	case "On", "ForceOn":
		want = true
	case "ForceOff", "GracefulShutdown":
		want = false
	case "PushPowerButton":
		want = !sy.on
	default: // restarts and NMI: the power stays as it is
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if want != sy.on || !sy.changeAt.IsZero() {
		if s.cfg.Transition > 0 {
			sy.target, sy.changeAt = want, now.Add(s.cfg.Transition)
		} else {
			sy.on, sy.changeAt = want, time.Time{}
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Service) createSession(w http.ResponseWriter, r *http.Request) {
	var body struct{ UserName, Password string }
	data, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
	if err != nil || json.Unmarshal(data, &body) != nil {
		redfishError(w, http.StatusBadRequest, "MalformedJSON", "The request body submitted was malformed JSON.")
		return
	}
	if !s.credentialsOK(body.UserName, body.Password) {
		redfishError(w, http.StatusUnauthorized, "NoValidSession", "Invalid username or password.")
		return
	}
	tokBytes := make([]byte, 16)
	_, _ = rand.Read(tokBytes)
	tok := fmt.Sprintf("%x", tokBytes)
	s.mu.Lock()
	s.nextSess++
	id := strconv.Itoa(s.nextSess)
	s.sessions[tok] = id
	s.mu.Unlock()
	uri := "/redfish/v1/SessionService/Sessions/" + id
	w.Header().Set("X-Auth-Token", tok)
	w.Header().Set("Location", uri)
	writeJSON(w, http.StatusCreated, map[string]any{
		"@odata.id": uri, "@odata.type": "#Session.v1_3_0.Session", "Id": id, "Name": "User Session", "UserName": body.UserName,
	})
}

// selfSigned makes a CA and a server certificate for 127.0.0.1 and localhost.
func selfSigned() (tls.Certificate, []byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "redfishsim CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	return tls.Certificate{Certificate: [][]byte{der, caDER}, PrivateKey: key}, caPEM, nil
}
