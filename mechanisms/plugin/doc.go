// Package plugin loads memory mechanisms written in C, C++ or Rust against
// the plugin C ABI (include/memgen/mechanism.h, generated from the spec).
package plugin
