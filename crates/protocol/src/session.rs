//! The order of messages, as the daemon enforces it on each connection.
//!
//! ```text
//! AwaitHello ──hello (same version)──▶ Greeted ──register──▶ Tenant
//!                                        │ status_request      │ usage, budget_met, returned, status_request
//!                                        └──────◀──────────────┘ (a tenant stays a tenant)
//!                                        └──lend──▶ Lender: offer, slabs, status_request
//! ```
//! Anything else (a second hello, a second register, usage before register, a version
//! mismatch) is a [`ProtocolError`]; the daemon answers it with an error and closes.

use crate::{ClientMessage, ProtocolError, PROTOCOL_VERSION};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionState {
    #[default]
    AwaitHello,
    Greeted,
    Tenant,
    Lender,
}

/// One connection's place in the protocol, seen from the daemon.
#[derive(Debug, Default)]
pub struct ServerSession {
    state: SessionState,
}

impl ServerSession {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn state(&self) -> SessionState {
        self.state
    }

    /// Checks that `message` may come now and moves to the state after it.
    pub fn accept(&mut self, message: &ClientMessage) -> Result<(), ProtocolError> {
        use ClientMessage as M;
        use SessionState as S;
        let next = match (self.state, message) {
            (S::AwaitHello, M::Hello { version, .. }) if *version == PROTOCOL_VERSION => S::Greeted,
            (S::AwaitHello, M::Hello { version, .. }) => {
                return Err(ProtocolError::VersionMismatch { ours: PROTOCOL_VERSION, theirs: *version })
            }
            (S::Greeted, M::Register { .. }) => S::Tenant,
            (S::Greeted, M::Lend { .. }) => S::Lender,
            (S::Greeted, M::StatusRequest) => S::Greeted,
            (S::Tenant, M::Usage { .. } | M::BudgetMet { .. } | M::Returned { .. } | M::StatusRequest) => S::Tenant,
            (S::Lender, M::Offer { .. } | M::Slabs { .. } | M::StatusRequest) => S::Lender,
            (state, other) => {
                let expected = match state {
                    S::AwaitHello => "hello",
                    S::Greeted => "register, lend or status_request",
                    S::Tenant => "usage, budget_met, returned or status_request",
                    S::Lender => "offer, slabs or status_request",
                };
                return Err(ProtocolError::OutOfOrder { expected, got: other.kind() });
            }
        };
        self.state = next;
        Ok(())
    }
}
