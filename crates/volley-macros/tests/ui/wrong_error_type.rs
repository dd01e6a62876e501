// Handlers answer errors with `volley::Status` (a code and a message), which travels on the wire.
use volley::Status;

#[volley::service]
trait Lookup {
    async fn get(&self, key: String) -> Result<u64, String>;
    #[sync]
    fn len(&self) -> Result<u64, Status>;
}

fn main() {}
