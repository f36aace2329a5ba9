// Package testbed holds the real peers nodefence is tested and demonstrated against: ipmi_sim BMCs
// (ipmisim), snmpsim PDUs (snmpsim), a Brocade FC switch over telnet and SSH (brocadesim), a Redfish
// service over HTTPS (redfishsim), an EC2 Query API endpoint checking SigV4 (ec2sim), a private
// dbus-daemon with a login1 stand-in (logind), a real kube-apiserver and etcd (kube), embedded etcd
// for tests (etcdtest), process supervision (procs), the tests' polling helper (wait), what the
// agent-fleet benchmarks share (benchkit), a real multi-node Kubernetes whose nodes
// have BMCs that really power them (cluster), nodefence deployed on it (nfcluster) and the
// end-to-end scenarios there (clustere2e), the Kubernetes scenario (kubescenario), the
// end-to-end tests (e2e), and the commands behind `make run`, `make demo` and the benchmarks.
package testbed
