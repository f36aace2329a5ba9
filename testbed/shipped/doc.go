// Package shipped holds tests of the shipped binaries as wholes, as an operator gets them: what
// they link (deps_test.go: no test or testbed code) and what the README and docs/ say about them
// (readme_test.go: every flag and make target they name exists;
// commands_test.go: every fencectl and nodefence-testbed command and go package path too;
// configref_test.go: docs/configuration.md's flag reference is what their help says). It has no code
// of its own.
package shipped
