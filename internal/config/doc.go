// Package config is the router's YAML configuration: the types, a strict loader (an unknown
// key is an error naming it, with its path), defaults, and Validate, which reports every problem
// at once, each naming the field path and the fix. Watcher reloads the file when it changes.
//
// Config is plain data at the bottom of the import graph: it imports no other package of
// kvroute. What it cannot judge alone (which policies exist, which parameters they take) the
// application passes in as Checks, and the application turns a config into components.
//
// Adding a section: add a field to Config and make its type implement section (setDefaults and
// validate); list it in Config.sections. The decoder needs no change.
package config
