"""A test's network namespace and what runs inside it: squid, origin and DNS servers, fake proxies,
the probe target, a banning site, a kubelet that runs Pods as squids."""
