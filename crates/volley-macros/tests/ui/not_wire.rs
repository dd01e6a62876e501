// Request and reply types need a codec tier: `volley::wire!` declares one.
use volley::Status;

pub struct Query {
    pub text: String,
}

pub struct Hits(pub Vec<u64>);

#[volley::service]
trait Search {
    async fn search(&self, q: Query) -> Result<Hits, Status>;
}

fn main() {}
