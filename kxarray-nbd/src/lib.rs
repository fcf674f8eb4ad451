//! The NBD (network block device) protocol and server for kxarray's
//! backends.
