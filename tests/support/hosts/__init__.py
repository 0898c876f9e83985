"""The KVM side: libvirtd on the test driver, a hypervisor host (libvirtd behind sshd in a network
namespace), a VM to bootstrap, a guest's agent."""
