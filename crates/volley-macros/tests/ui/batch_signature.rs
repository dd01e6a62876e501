// A batch handler takes every request that arrived together, and returns one result each.
use volley::Status;

#[volley::service]
trait Index {
    #[batch]
    async fn add(&self, doc: String) -> Vec<Result<u64, Status>>;
    #[batch]
    async fn remove(&self, ids: Vec<u64>) -> Result<u64, Status>;
    #[batch]
    fn flush(&self, ids: Vec<u64>) -> Vec<Result<(), Status>>;
}

fn main() {}
