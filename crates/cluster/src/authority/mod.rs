//! The cluster's authority: its certificate authority and each host's and
//! operator's credentials directory ([`credentials`]), the API's bearer
//! token ([`token`]), and the files they are kept in ([`files`]).

pub mod credentials;
pub mod files;
pub mod token;
