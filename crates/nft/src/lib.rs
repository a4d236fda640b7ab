//! nftables dataplane: renders the proxy's desired state into atomic nft transactions.
