use std::{
    marker::PhantomData,
    sync::{Arc, Mutex},
    vec,
};

use burn_communication::{CommunicationChannel, Message, Protocol, ProtocolClient};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, RwLock};

use crate::{GlobalCollectiveError, NodeId, node::base::NodeState};

/// ember patch: how long a sync waits for the other nodes' requests. They send theirs as soon as their own last
/// transfer completes, within one transfer of this node, so a node silent this long is gone (a crashed peer that
/// had finished its transfers would otherwise be waited for forever).
const PEER_SYNC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// Handles the status of sync requests from other nodes
pub(crate) struct SyncService<P: Protocol> {
    /// Current node's state, shared with the thread that does aggregations
    node_state: Arc<RwLock<Option<NodeState>>>,
    /// The number of peers that have requested to sync with us since the last successful sync.
    syncing_peers: Mutex<Vec<NodeId>>,
    /// Notification on each incoming sync request
    sync_notif: Notify,

    _p: PhantomData<P>,
}

#[derive(Debug, Serialize, Deserialize)]
struct SyncRequest(NodeId);

impl<P: Protocol> SyncService<P> {
    pub fn new(node_state: Arc<RwLock<Option<NodeState>>>) -> Self {
        Self {
            node_state,
            syncing_peers: Mutex::new(vec![]),
            sync_notif: Notify::new(),
            _p: PhantomData,
        }
    }

    fn add_syncing_peer(&self, peer: NodeId) {
        let mut syncing_peers = self.syncing_peers.lock().unwrap();
        syncing_peers.push(peer);
    }

    /// Sync with all peers.
    ///
    /// ember patch: a peer that cannot be reached, or that never syncs, is `PeerLost` (upstream panicked on the
    /// first and waited forever on the second).
    pub async fn sync(&self) -> Result<(), GlobalCollectiveError> {
        // we can't sync while we register
        let node_state = self.node_state.read().await;
        let node_state = node_state
            .as_ref()
            .expect("Trying to sync a node before having registered to the orchestrator");

        // this peer is syncing
        self.add_syncing_peer(node_state.node_id);
        for (id, addr) in &node_state.nodes {
            if *id == node_state.node_id {
                continue;
            }

            let mut connection = P::Client::connect(addr.clone(), "sync")
                .await
                .ok_or(GlobalCollectiveError::PeerLost(*id))?;
            let msg = SyncRequest(node_state.node_id);
            let sync_bytes = rmp_serde::to_vec(&msg).unwrap();
            connection
                .send(Message::new(sync_bytes.into()))
                .await
                .map_err(|_| GlobalCollectiveError::PeerLost(*id))?;
        }
        loop {
            // ember patch: registered before the check, so a request arriving between the check and the wait
            // still wakes this task (`notify_waiters` only wakes futures that already exist).
            let notified = self.sync_notif.notified();
            {
                let mut syncing_peers = self.syncing_peers.lock().unwrap();
                let all_synced = node_state
                    .nodes
                    .keys()
                    .all(|id| syncing_peers.contains(id));
                if all_synced {
                    // ember patch: consume one request per node from the shared list. Upstream cleared a copy,
                    // so the list kept every request and the second sync of a session never completed; a
                    // faster peer's request for the next sync stays in the list.
                    for id in node_state.nodes.keys() {
                        let at = syncing_peers
                            .iter()
                            .position(|peer| peer == id)
                            .expect("checked above");
                        syncing_peers.remove(at);
                    }
                    return Ok(());
                }
            }
            // Wait for the next sync to come in
            if tokio::time::timeout(PEER_SYNC_TIMEOUT, notified).await.is_err() {
                let syncing_peers = self.syncing_peers.lock().unwrap();
                let silent = node_state
                    .nodes
                    .keys()
                    .find(|id| !syncing_peers.contains(id))
                    .copied()
                    .unwrap_or(node_state.node_id);
                return Err(GlobalCollectiveError::PeerLost(silent));
            }
        }
    }

    pub async fn handle_sync_connection<C: CommunicationChannel>(&self, mut channel: C) {
        let msg = channel.recv().await.unwrap();
        let Some(msg) = msg else {
            return;
        };

        let msg = rmp_serde::from_slice::<SyncRequest>(&msg.data).unwrap();

        self.add_syncing_peer(msg.0);

        self.sync_notif.notify_waiters();
    }
}
