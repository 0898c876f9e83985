"""What is built once per machine and cached: guest images, the controller's container image, a
Debian package repository."""
