// A ServiceClient may send a request again on failover, so its requests must be Clone; a plain
// Client needs no such thing.
use volley::{Client, ServiceClient, Status};

#[derive(serde::Serialize, serde::Deserialize)]
pub struct Ticket(pub u64);
volley::wire!(Ticket);

#[volley::service]
trait Desk {
    async fn take(&self, t: Ticket) -> Result<u64, Status>;
}

async fn by_address(c: DeskClient<Client>) -> volley::Result<u64> {
    c.take(Ticket(1)).await
}

async fn by_name(c: DeskClient<ServiceClient>) -> volley::Result<u64> {
    c.take(Ticket(1)).await
}

fn main() {}
