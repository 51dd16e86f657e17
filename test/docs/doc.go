// Package docs checks that the documentation still matches the code: README.md and docs/*.md
// (except the measurement logs docs/results.md, docs/sync-cost.md and docs/experiments/) are
// read by the tests in this directory, which fail on a relative link to a file or heading that
// is not there, on a `kvroute` command line naming a verb or flag the binary does not have, and
// on a YAML config example that kvroute's strict config loader refuses. The rules of each check
// are written above it in its test file.
package docs
