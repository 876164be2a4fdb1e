locals {
  tags = merge(var.tags, { project = "sieve", environment = var.environment })
}

module "storage" {
  source        = "../../../modules/storage"
  name          = var.name
  bucket_name   = var.bucket_name
  force_destroy = var.force_destroy
  tags          = local.tags
}

module "network" {
  source      = "../../../modules/network"
  name        = var.name
  cidr_block  = var.vpc_cidr
  az_count    = var.az_count
  kms_key_arn = module.storage.kms_key_arn
  tags        = local.tags
}

module "eks" {
  source             = "../../../modules/eks"
  name               = var.name
  private_subnet_ids = module.network.private_subnet_ids
  public_api_cidrs   = var.public_api_cidrs
  kms_key_arn        = module.storage.kms_key_arn
  gpu_node_groups    = var.gpu_node_groups
  cpu_node_group     = var.cpu_node_group
  namespace          = var.namespace
  bucket_arn         = module.storage.bucket_arn
  tags               = local.tags
}

module "mlflow_db" {
  source                    = "../../../modules/mlflow_db"
  name                      = var.name
  vpc_id                    = module.network.vpc_id
  private_subnet_ids        = module.network.private_subnet_ids
  cluster_security_group_id = module.eks.cluster_security_group_id
  kms_key_arn               = module.storage.kms_key_arn
  reader_role_name          = module.eks.workload_role_names["mlflow"]
  deletion_protection       = var.deletion_protection
  db_password_version       = var.db_password_version
  tags                      = local.tags
}
