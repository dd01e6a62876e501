// A method must say how its handler runs: `async fn` or `#[sync] fn`.
use volley::Status;

#[volley::service]
trait Counter {
    fn get(&self, key: String) -> Result<u64, Status>;
}

fn main() {}
