flower-superlink --insecure --host 127.0.0.1 --port 8000 --disable-runtime-dependency-installation
fedvit tap --listen 127.0.0.1:9100 --upstream 127.0.0.1:8000 --out captures/
flower-supernode --insecure --superlink 127.0.0.1:9100 --port 9094 --node-config "partition-id=0 num-partitions=2"
flower-supernode --insecure --superlink 127.0.0.1:9100 --port 9095 --node-config "partition-id=1 num-partitions=2"
flwr run . tapped --stream -c 'num-server-rounds=1 partition-sizes="1000,1200" dirichlet-alpha=0.5 images="textures" batch-size=32 lr=0.01 local-epochs=1 fraction-evaluate=0.0'
fedvit audit captures/ --out audit/ --model cnnapp.task:Net --app-dir . --data cnnapp_partitions:large --partition=2552335776937770577=0 --partition=14059731287060179778=1 --decoy-partitions 2-5
