package main

// archNames are the syscalls of filter only amd64 has.
var archNames = []string{"epoll_wait", "poll", "arch_prctl"}
