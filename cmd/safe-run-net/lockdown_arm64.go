package main

// archNames are the syscalls of filter only arm64 has.
var archNames = []string{}
