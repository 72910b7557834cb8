//! Decodes one hostile Metadata response with the registry's unpatched kafka-protocol
//! 0.18.0. The downstream test runs it under an address-space limit and expects it to
//! abort: that shows the bytes the test sends are the ones that kill an unpatched build.

use kafka_protocol::messages::MetadataResponse;
use kafka_protocol::protocol::Decodable;

fn main() {
    let mut body = bytes::Bytes::from(ottla_downstream_check::metadata_body(8, i32::MAX, 1 << 20));
    match MetadataResponse::decode(&mut body, 8) {
        Ok(_) => println!("decoded"),
        Err(e) => println!("decode error: {e}"),
    }
}
