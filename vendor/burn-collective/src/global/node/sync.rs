use std::{
    marker::PhantomData,
    sync::{Arc, Mutex},
    vec,
};

use burn_communication::{Address, CommunicationChannel, Message, Protocol, ProtocolClient};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, RwLock};

use crate::{GlobalCollectiveError, NodeId, node::base::NodeState};

/// ember patch: how long a sync waits for the other nodes' requests. They send theirs as soon as their own last
/// transfer completes, within one transfer of this node, so a node silent this long is gone (a crashed peer that
/// had finished its transfers would otherwise be waited for forever).
const PEER_SYNC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// ember patch: how often a sync that is still waiting checks that the silent peers are alive. A peer whose
/// process died after its last transfer but before its request (or during it) never sends one; its server is gone
/// with it, so a connection to it is refused at once.
const PEER_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// ember patch: how long a liveness check waits to connect. A machine that vanished from the network (rather
/// than a process that died) leaves the connection hanging; the overall `PEER_SYNC_TIMEOUT` covers that case.
const PEER_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

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
    /// first and waited forever on the second). While waiting, silent peers are checked every
    /// `PEER_CHECK_INTERVAL`: one whose server refuses a connection is lost.
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
        let waiting_since = tokio::time::Instant::now();
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
            if tokio::time::timeout(PEER_CHECK_INTERVAL, notified).await.is_ok() {
                continue;
            }
            let silent: Vec<NodeId> = {
                let syncing_peers = self.syncing_peers.lock().unwrap();
                node_state
                    .nodes
                    .keys()
                    .filter(|id| !syncing_peers.contains(id))
                    .copied()
                    .collect()
            };
            if waiting_since.elapsed() >= PEER_SYNC_TIMEOUT {
                return Err(GlobalCollectiveError::PeerLost(
                    silent.first().copied().unwrap_or(node_state.node_id),
                ));
            }
            for id in silent {
                let alive = match node_state.nodes.get(&id) {
                    Some(addr) => Self::is_alive(addr).await,
                    None => false,
                };
                if !alive {
                    return Err(GlobalCollectiveError::PeerLost(id));
                }
            }
        }
    }

    /// ember patch: whether a peer's server still accepts connections. The check connects to its sync route
    /// and closes again at once, which that route's handler takes as a request-less connection and ignores.
    async fn is_alive(addr: &Address) -> bool {
        let connect = P::Client::connect(addr.clone(), "sync");
        match tokio::time::timeout(PEER_CONNECT_TIMEOUT, connect).await {
            Ok(Some(mut connection)) => {
                let _ = connection.close().await;
                true
            }
            Ok(None) => false,
            // Not refused, only slow: the overall timeout decides.
            Err(_) => true,
        }
    }

    /// ember patch: a connection that breaks before its request arrives (the peer's process died while sending
    /// it) or carries no valid request is dropped with a warning; upstream panicked on the runtime's thread. The
    /// waiting `sync` notices such a peer through its liveness checks.
    pub async fn handle_sync_connection<C: CommunicationChannel>(&self, mut channel: C) {
        let msg = match channel.recv().await {
            Ok(Some(msg)) => msg,
            // A liveness check, or a peer closing without a request.
            Ok(None) => return,
            Err(err) => {
                log::warn!("[Sync Service] A peer's sync connection broke: {err:?}");
                return;
            }
        };

        let msg = match rmp_serde::from_slice::<SyncRequest>(&msg.data) {
            Ok(msg) => msg,
            Err(err) => {
                log::warn!("[Sync Service] Ignoring a malformed sync request: {err}");
                return;
            }
        };

        self.add_syncing_peer(msg.0);

        self.sync_notif.notify_waiters();
    }
}
