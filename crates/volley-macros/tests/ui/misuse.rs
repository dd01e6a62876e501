// Shapes a service method cannot have.
use volley::Status;

#[volley::service]
trait Misused {
    #[sync]
    async fn both(&self, x: u64) -> Result<u64, Status>;
    async fn mutable(&mut self, x: u64) -> Result<u64, Status>;
    async fn two(&self, a: u64, b: u64) -> Result<u64, Status>;
    async fn generic<T>(&self, x: u64) -> Result<u64, Status>;
    async fn no_result(&self, x: u64) -> u64;
    type Extra;
}

#[volley::service(nmae = "typo")]
trait BadArgument {
    async fn get(&self, x: u64) -> Result<u64, Status>;
}

fn main() {}

#[volley::service]
trait Clashes {
    async fn get(&self, x: u64) -> Result<u64, Status>;
    async fn get_batch(&self, x: u64) -> Result<u64, Status>;
    #[sync]
    fn new(&self) -> Result<u64, Status>;
}
