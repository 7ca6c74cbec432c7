//! TCP transport (tokio). STUB: being written.
use super::*;

pub struct Tcp;

impl Tcp {
    pub fn new() -> anyhow::Result<Tcp> {
        anyhow::bail!("tcp transport being written")
    }
}

impl Transport for Tcp {
    fn name(&self) -> &'static str {
        "tcp"
    }
    fn listen(&self, _addr: &str, _events: EventTx) -> anyhow::Result<Box<dyn Listener>> {
        unimplemented!()
    }
    fn connect(&self, _addr: &str, _events: EventTx) -> anyhow::Result<Arc<dyn Conn>> {
        unimplemented!()
    }
    fn serve_region(
        &self,
        _region: Arc<Region>,
        _addr: &str,
    ) -> anyhow::Result<Box<dyn RegionServer>> {
        unimplemented!()
    }
    fn reader(&self) -> anyhow::Result<Arc<dyn RegionReader>> {
        unimplemented!()
    }
}
