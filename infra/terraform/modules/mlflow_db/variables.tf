variable "name" {
  type        = string
  description = "Resource prefix."
}

variable "vpc_id" {
  type        = string
  description = "VPC of the database."
}

variable "private_subnet_ids" {
  type        = list(string)
  description = "Private subnets for the database."
}

variable "cluster_security_group_id" {
  type        = string
  description = "The EKS cluster security group: the only source allowed to reach PostgreSQL."
}

variable "kms_key_arn" {
  type        = string
  description = "KMS key encrypting the database, its performance insights and the secret."
}

variable "reader_role_name" {
  type        = string
  description = "IAM role (the MLflow server's IRSA role) allowed to read the database secret."
}

variable "postgres_version" {
  type        = string
  description = "RDS PostgreSQL engine version."
  default     = "16.4"
}

variable "db_instance_class" {
  type        = string
  description = "RDS instance class."
  default     = "db.t4g.small"
}

variable "multi_az" {
  type        = bool
  description = "Run the database in two availability zones."
  default     = true
}

variable "deletion_protection" {
  type        = bool
  description = "Refuse to delete the database (set false, apply, then destroy; a final snapshot is still taken)."
  default     = true
}

variable "db_password_version" {
  type        = number
  description = "Bump to generate and write a new database password (then restart the MLflow deployment)."
  default     = 1
  validation {
    condition     = var.db_password_version >= 1 && floor(var.db_password_version) == var.db_password_version
    error_message = "db_password_version must be a positive integer."
  }
}

variable "tags" {
  type        = map(string)
  description = "Tags applied to every resource."
  default     = {}
}
