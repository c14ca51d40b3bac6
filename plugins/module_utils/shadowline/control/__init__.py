"""The control plane: the node agent, coordination through etcd, discovery, the lock, processes and health."""
