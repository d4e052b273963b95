//! The control plane: what the cluster should run and what makes it so.
//! It reads and writes the store and asks agents through their API
//! ([`crate::client::Agents`]); it imports no agent code, so it runs (and
//! is tested) against an in-memory store and hosts.
//!
//! - [`desired`]: the desired state: each VM's record (its spec and
//!   wanted protection, its phase), the drained hosts.
//! - [`controller`]: one agent at a time makes the cluster match it:
//!   places VMs, keeps them protected, empties drained hosts.
//! - [`ops`]: operations across agents (create, protect a VM on another
//!   host, move, drain), for `ftvm cluster`, the dashboard and the
//!   controller.
//! - [`events`]: the cluster's event log (the pairs' events and the
//!   controller's actions), and what it tells of each VM's history.

pub mod controller;
pub mod desired;
pub mod events;
#[cfg(test)]
mod fake_hosts;
pub mod ops;
