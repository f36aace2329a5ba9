// Package signals reads the kubelet eviction signals of the node the agent runs on, computed exactly
// as kubelet computes them: memory.available from the cgroup filesystem (never from free(1)),
// pid.available from the kernel's pid limit and task count, and the nodefs, imagefs and containerfs
// available bytes and free inodes with statfs(2) on configured paths, whose devices tell the
// filesystem layout (Layout).
//
// The parsers are pure functions over file contents (ParseMemoryStat, ParseMeminfo, ParseUint,
// ParseLoadavgTasks); Reader does the file I/O below configurable roots so that tests can point it at
// fixture trees.
package signals
