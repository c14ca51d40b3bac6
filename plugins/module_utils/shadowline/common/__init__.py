"""The ground floor: what every shadowline process on a node shares and that needs nothing but the standard library
(the etcd client, /proc and cgroups, HTTP, events, the lock, the policies, values, problems and settings types).
Nothing here imports another room of the package."""
