locals {
  tags = merge(var.tags, { project = "sieve", environment = var.environment })
}

module "storage" {
  source      = "../../modules/storage"
  name        = var.name
  bucket_name = var.bucket_name
  tags        = local.tags
}

module "network" {
  source      = "../../modules/network"
  name        = var.name
  cidr_block  = var.vpc_cidr
  az_count    = var.az_count
  kms_key_arn = module.storage.kms_key_arn
  tags        = local.tags
}

module "eks" {
  source             = "../../modules/eks"
  name               = var.name
  private_subnet_ids = module.network.private_subnet_ids
  public_api_cidrs   = var.public_api_cidrs
  kms_key_arn        = module.storage.kms_key_arn
  gpu_node_groups    = var.gpu_node_groups
  namespace          = var.namespace
  bucket_arn         = module.storage.bucket_arn
  tags               = local.tags
}

resource "kubernetes_namespace_v1" "sieve" {
  metadata {
    name = var.namespace
  }
}

module "mlflow" {
  source                    = "../../modules/mlflow"
  name                      = var.name
  vpc_id                    = module.network.vpc_id
  private_subnet_ids        = module.network.private_subnet_ids
  cluster_security_group_id = module.eks.cluster_security_group_id
  kms_key_arn               = module.storage.kms_key_arn
  namespace                 = kubernetes_namespace_v1.sieve.metadata[0].name
  role_arn                  = module.eks.workload_role_arns["mlflow"]
  bucket                    = module.storage.bucket
  image                     = var.image
  tags                      = local.tags
}

module "ray" {
  source            = "../../modules/ray"
  namespace         = kubernetes_namespace_v1.sieve.metadata[0].name
  image             = var.image
  role_arn          = module.eks.workload_role_arns["ray"]
  tracking_uri      = module.mlflow.tracking_uri
  storage_uri       = "s3://${module.storage.bucket}/runs"
  gpu_worker_groups = var.ray_gpu_worker_groups
}
