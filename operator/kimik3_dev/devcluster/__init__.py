"""A real local Kubernetes control plane (etcd + kube-apiserver) and third-party CRDs for tests and `kimik3 dev`."""
