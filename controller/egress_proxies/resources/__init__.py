"""The Proxy and ProxyPool resources as plain data, with what is derived from them: names, hashes,
conditions, timestamps, schema validation and the pool's decisions. Pure: no I/O beyond reading
the CRDs' schemas once; imports nothing else of the controller."""
