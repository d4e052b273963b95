//! `ftvm-etcd`: what ftvm keeps in etcd, the cluster's store (a majority-
//! replicated key-value store; Debian's `etcd-server`), and how it gets
//! there.
//!
//! - [`endpoints`]: where etcd is and how to reach it (its URLs, and the
//!   TLS a cluster's etcd is spoken to with).
//! - [`client`]: a blocking client over etcd's own async one, for the
//!   threads of a running VM (the arbiter is asked from the live loop's
//!   side threads, which have no async runtime).
//! - [`arbiter`]: the split-brain test-and-set (VMware FT §2.3, "a
//!   third-party server") as etcd transactions: an
//!   [`ftvm_replication::arbiter::ArbiterStore`] beside the shared
//!   directory.
//! - [`local`]: a cluster of etcd members on this host's loopback or in
//!   network namespaces, started and stopped by tests and the demo.

pub mod arbiter;
pub mod client;
pub mod endpoints;
pub mod local;

pub use arbiter::EtcdArbiter;
pub use client::{Etcd, EtcdError};
pub use endpoints::{Endpoints, EtcdTls};
